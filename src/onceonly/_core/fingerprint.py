# SPDX-License-Identifier: MIT
"""Payload fingerprints: the SHA-256 of the canonical payload, or the caller's own."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any

from onceonly._core.canonical import canonical_json

Fingerprinter = Callable[[Any], str]


def fingerprint(
    payload: Any,
    *,
    custom: Fingerprinter | None = None,
    fields: Iterable[str] | None = None,
) -> str:
    """The fingerprint that identifies ``payload`` for mismatch checks.

    Args:
        payload: the message body or call arguments.
        custom: a callable that returns the fingerprint text itself.
        fields: only these top-level fields count.
    """
    if custom is not None:
        value = custom(payload)
        if not isinstance(value, str):
            value = canonical_json(value).decode("utf-8")
        return "c:" + hashlib.sha256(value.encode("utf-8")).hexdigest()
    return hashlib.sha256(canonical_json(payload, fields)).hexdigest()
