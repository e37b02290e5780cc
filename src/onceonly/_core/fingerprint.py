# SPDX-License-Identifier: MIT
"""Payload fingerprints: the SHA-256 of the canonical payload, or of the caller's own value.

A fingerprint names the scheme that made it, before its first colon (spec §2.2):

========  ==============================================================================
scheme    fingerprint
========  ==============================================================================
``1``     64 hex characters, no colon: SHA-256 of the scheme-1 canonical JSON (releases
          before fingerprints were versioned; that form let some payloads collide)
``2``     ``"2:" + hex``: SHA-256 of the canonical JSON of :mod:`onceonly._core.canonical`
``c``     ``"c:" + hex``: SHA-256 of the text a ``fingerprint=`` callable returned
          (unchanged since scheme 1, so old custom fingerprints still compare)
``c2``    ``"c2:" + hex``: SHA-256 of the scheme-2 canonical JSON of the non-text value a
          ``fingerprint=`` callable returned
========  ==============================================================================

Only fingerprints of one scheme can be compared: :func:`comparable` says whether two
are. A record written under another scheme (before an upgrade) is neither a match nor a
mismatch; the state machine skips the payload check for it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any

from onceonly._core.canonical import canonical_json
from onceonly.errors import InvalidPayload

__all__ = ["SCHEME", "Fingerprinter", "comparable", "fingerprint", "scheme_of"]

Fingerprinter = Callable[[Any], str]

SCHEME = "2"
"""The scheme of the fingerprints :func:`fingerprint` makes by default."""


def fingerprint(
    payload: Any,
    *,
    custom: Fingerprinter | None = None,
    fields: Iterable[str] | None = None,
) -> str:
    """The fingerprint that identifies ``payload`` for mismatch checks.

    Args:
        payload: the message body or call arguments.
        custom: a callable that returns the fingerprint text itself (or a value whose
            canonical JSON is fingerprinted).
        fields: only these top-level fields count.

    Returns:
        ``"2:"`` + 64 hex characters; ``"c:"``/``"c2:"`` + 64 hex for ``custom``.

    Raises:
        InvalidPayload: the payload (or the custom value) cannot be fingerprinted; see
            :mod:`onceonly._core.canonical` for the limits.
    """
    if custom is not None:
        value = custom(payload)
        if isinstance(value, str):
            try:
                text = value.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidPayload(
                    "the fingerprint= callable returned text with a lone surrogate"
                ) from None
            return "c:" + hashlib.sha256(text).hexdigest()
        return "c2:" + hashlib.sha256(canonical_json(value)).hexdigest()
    return f"{SCHEME}:" + hashlib.sha256(canonical_json(payload, fields)).hexdigest()


def scheme_of(fingerprint: str) -> str:
    """The scheme that made ``fingerprint``: the text before its first colon, else ``"1"``."""
    scheme, colon, _ = fingerprint.partition(":")
    return scheme if colon else "1"


def comparable(stored: str, incoming: str) -> bool:
    """Whether ``stored`` and ``incoming`` were made by the same scheme.

    Two fingerprints of one scheme are equal exactly when their payloads are the same;
    two of different schemes say nothing about each other (treat them as neither a
    match nor a mismatch).
    """
    return scheme_of(stored) == scheme_of(incoming)
