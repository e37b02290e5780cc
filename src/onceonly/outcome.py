# SPDX-License-Identifier: MIT
"""What processing a delivery returns."""

from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import dataclass
from typing import Generic, TypeVar

from onceonly.errors import ConfigurationError

__all__ = ["Outcome"]

T = TypeVar("T")


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """The result of processing one delivery.

    Attributes:
        result: the handler's result (decoded from the store when ``replayed``).
        replayed: true when the handler did not run because the key had completed.
        key: the idempotency key.
        attempt: the 1-based attempt that produced the result.

    .. versionadded:: 0.1
    """

    result: T
    replayed: bool
    key: str
    attempt: int


def seconds(value: float | dt.timedelta | None, *, what: str, allow_none: bool = False) -> float:
    """``value`` in seconds; :class:`ConfigurationError` unless positive (or None if allowed)."""
    if value is None:
        if allow_none:
            return float("inf")
        raise ConfigurationError(f"{what} is required")
    out = value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
    if not out > 0:
        raise ConfigurationError(f"{what} must be positive, not {value!r}")
    return out


def new_token() -> int:
    """A fresh fencing token: 63 random bits, so a token is never reused for a key,
    even after its record was purged and claimed again."""
    return secrets.randbits(63) or 1
