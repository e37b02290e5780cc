# SPDX-License-Identifier: MIT
"""The one dead-letter header envelope every broker transport sends (pure: no I/O).

A dead letter is the original body with the original headers (minus the broker's own
bookkeeping, which a redrive must not inherit) plus:

==========================  ===================================================
``onceonly-dead-reason``    the verdict's reason (``max-deliveries``, ...)
``onceonly-error``          the error text, one line, at most
                            :data:`~onceonly._core.settle.MAX_ERROR_CHARS` characters
``onceonly-attempts``       the inbox's failed attempts (``0`` when unknown)
``onceonly-message-id``     the message id, when one was found
``onceonly-source``         the queue, subject or stream it was consumed from
==========================  ===================================================

A transport's wire format may only re-encode these values (NATS escapes non-ASCII
characters); it never adds or drops one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from onceonly._core.settle import Verdict, header_text
from onceonly.messaging import (
    HEADER_ATTEMPTS,
    HEADER_ERROR,
    HEADER_MESSAGE_ID,
    HEADER_REASON,
)

__all__ = ["HEADER_SOURCE", "envelope"]

#: Where a dead-lettered message was consumed from.
HEADER_SOURCE = "onceonly-source"


def envelope(
    original: Mapping[str, Any],
    verdict: Verdict,
    message_id: str | None,
    source: str,
    *,
    drop: Callable[[str], bool] | None = None,
) -> dict[str, Any]:
    """The headers of the dead letter of a message with headers ``original``.

    Args:
        original: the headers the message arrived with.
        verdict: the DEAD_LETTER verdict.
        message_id: the message id, when it is known.
        source: where the message was consumed from.
        drop: names of the broker's own headers not to copy (delivery counts, ids
            the broker deduplicates on).
    """
    headers = {k: v for k, v in original.items() if drop is None or not drop(str(k))}
    reason = verdict.reason or "dead"
    headers[HEADER_REASON] = reason
    headers[HEADER_ERROR] = header_text(verdict.error or reason)
    headers[HEADER_ATTEMPTS] = str(verdict.attempts or 0)
    headers[HEADER_SOURCE] = header_text(source)
    if message_id:
        headers[HEADER_MESSAGE_ID] = header_text(message_id)
    else:
        headers.pop(HEADER_MESSAGE_ID, None)
    return headers
