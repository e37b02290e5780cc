# SPDX-License-Identifier: MIT
"""What every broker consumer shares: message ids, decoding, and the settlement rule.

A consumer turns each delivery into ``inbox.process(message_id, payload, handler)``
and settles it with the broker by the :class:`Verdict` that :func:`settle` returns:

* ``ACK`` — processed (or replayed): acknowledge. Only after the commit.
* ``RETRY`` — the handler failed, a concurrent duplicate is in flight, or the store is
  unavailable: leave the message for redelivery (nack / nak / no ack).
* ``DEAD`` — the key is dead-lettered, reuses a key with another payload, or has no
  usable id: publish it to the dead-letter destination with the reason, then ack.
  Never a silent drop.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from onceonly._core.keys import content_key, validate_key
from onceonly.errors import (
    DeadLettered,
    InFlight,
    InvalidKey,
    MissingMessageId,
    PayloadMismatch,
    StoreError,
)
from onceonly.inbox_async import AsyncInbox, AsyncTx
from onceonly.messaging import Delivery
from onceonly.outcome import Outcome

__all__ = ["Handler", "MessageIds", "Settlement", "Verdict", "decode_body", "settle"]

log = logging.getLogger("onceonly.brokers")

Handler = Callable[[Any, AsyncTx], Awaitable[Any]]


class Verdict(str, enum.Enum):
    """How a consumer settles a delivery with its broker."""

    ACK = "ack"
    RETRY = "retry"
    DEAD = "dead"


@dataclass(frozen=True)
class Settlement:
    """The verdict for one delivery, with what the dead-letter message must carry."""

    verdict: Verdict
    outcome: Outcome[Any] | None = None
    reason: str | None = None  # dead: "dead-lettered", "payload-mismatch", "invalid-id"
    error: str | None = None
    attempts: int | None = None
    retry_after: float | None = None


class MessageIds:
    """Where a consumer takes a message's id from.

    The broker's own id (RabbitMQ ``message_id``, the ``Nats-Msg-Id`` header, the
    stream entry's id field) comes first. Without it, ``fallback`` decides:

    * ``None`` — no fallback: :class:`~onceonly.MissingMessageId` (the message is
      dead-lettered with reason ``invalid-id``);
    * ``"content"`` — the SHA-256 of the canonical payload (identical payloads are one
      message);
    * a ``str`` naming a top-level payload field, e.g. ``"event_id"``;
    * a callable ``payload -> str``.
    """

    def __init__(self, fallback: str | Callable[[Any], str] | None = None) -> None:
        self.fallback = fallback

    def resolve(self, broker_id: str | None, payload: Any) -> str:
        """The message id; raises InvalidKey / MissingMessageId when there is none."""
        if broker_id:
            return validate_key(broker_id, what="message id")
        fb = self.fallback
        if fb is None:
            raise MissingMessageId(
                "the message has no id (no broker message id or header) and the consumer "
                "has no fallback; set message_id='content', a payload field, or a callable"
            )
        if fb == "content":
            return content_key(payload)
        if isinstance(fb, str):
            value = payload.get(fb) if isinstance(payload, dict) else None
            if value is None:
                raise MissingMessageId(
                    f"the message has no broker id and no {fb!r} field in its payload"
                )
            return validate_key(str(value), what="message id")
        return validate_key(fb(payload), what="message id")


def decode_body(body: bytes) -> Any:
    """JSON bodies decode to their value; anything else stays bytes."""
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return bytes(body)


async def settle(
    inbox: AsyncInbox,
    handler: Handler,
    ids: MessageIds,
    broker_id: str | None,
    payload: Any,
    delivery: Callable[[str], Delivery],
) -> Settlement:
    """Process one delivery through ``inbox`` and say how to settle it.

    Args:
        inbox: the consumer's inbox.
        handler: ``async handler(payload, tx)``.
        ids: the message-id policy.
        broker_id: the id the broker carried, if any.
        payload: the decoded body.
        delivery: builds the :class:`Delivery` once the message id is known.

    Cancellation (a shutdown that cannot wait) propagates: the transaction rolls back
    and the broker redelivers.
    """
    try:
        message_id = ids.resolve(broker_id, payload)
    except InvalidKey as exc:
        return Settlement(Verdict.DEAD, reason="invalid-id", error=str(exc))
    try:
        outcome = await inbox.process(message_id, payload, handler, delivery=delivery(message_id))
    except DeadLettered as exc:
        return Settlement(
            Verdict.DEAD, reason="dead-lettered", error=exc.error, attempts=exc.attempts
        )
    except PayloadMismatch as exc:
        return Settlement(Verdict.DEAD, reason="payload-mismatch", error=str(exc))
    except InFlight as exc:
        return Settlement(Verdict.RETRY, reason="in-flight", retry_after=exc.retry_after)
    except StoreError as exc:
        log.warning("store error on %s; leaving it for redelivery: %s", message_id, exc)
        return Settlement(Verdict.RETRY, reason="store-error", error=str(exc))
    except Exception as exc:
        log.warning("handler failed on %s; leaving it for redelivery: %r", message_id, exc)
        return Settlement(Verdict.RETRY, reason="handler-error", error=repr(exc))
    return Settlement(Verdict.ACK, outcome=outcome)


class InFlightTracker:
    """Counts running handlers so a graceful stop can wait for them."""

    def __init__(self, concurrency: int) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.semaphore = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self, timeout: float | None = None) -> None:
        """Wait for the running handlers (up to ``timeout``), then cancel the rest."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
