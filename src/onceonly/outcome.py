# SPDX-License-Identifier: MIT
"""What processing a delivery returns, and the rules both modes share for replays and
failures (one place, so the inbox and leased mode cannot drift apart)."""

from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from onceonly._core import codec
from onceonly._core.state import Record, Write, cached_error_write, fail_write
from onceonly.errors import (
    ConfigurationError,
    CorruptRecord,
    EncodingError,
    OnceOnlyError,
    ReplayedError,
)

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


def replayed_result(
    record: Record, cache_errors: tuple[type[BaseException], ...], result_type: Any
) -> Any:
    """The stored result of a completed ``record``; raises its cached error instead.

    The result is decoded type-preserving (a replay returns what the first run
    returned; ``result_type`` rebuilds dataclasses and models). A cached error whose
    class is no longer in ``cache_errors`` is raised as :class:`~onceonly.ReplayedError`
    carrying the original summary.

    Raises:
        CorruptRecord: the stored result cannot be decoded, or no longer fits
            ``result_type`` (the record is left as it is).
    """
    if record.error is not None and record.result is not None:
        exc = codec.decode_error(record.result, cache_errors)
        if exc is None:
            raise ReplayedError(
                f"cached error replayed: {record.error}", key=record.key, scope=record.scope
            )
        raise exc
    if not record.result:
        return None
    try:
        return codec.decode(record.result, result_type)
    except EncodingError as exc:
        raise CorruptRecord(
            f"the stored result of {record.scope!r}/{record.key!r} cannot be replayed: "
            f"{exc.message}",
            key=record.key,
            scope=record.scope,
        ) from exc


def failure_write(
    claimed: Record,
    exc: Exception,
    *,
    payload: Any,
    keep_payload: bool,
    cache_errors: tuple[type[BaseException], ...],
    ttl: float | None,
    max_attempts: int,
    max_bytes: int,
) -> Write:
    """What to store when the run holding ``claimed`` raised ``exc``.

    An error listed in ``cache_errors`` completes the key with the encoded error (replayed
    to duplicates). Any other is a failed attempt (dead at ``max_attempts``) that keeps
    the claim's checkpoint and, with ``keep_payload``, a JSON snapshot of the payload
    for redrive (none when the payload is not JSON or is too large).
    """
    summary = codec.error_summary(exc)
    if isinstance(exc, cache_errors):
        return cached_error_write(claimed, summary, codec.encode_error(exc), ttl)
    snapshot = None
    if keep_payload and payload is not None:
        try:
            snapshot = codec.encode(payload, max_bytes=max_bytes, what="payload")
        except OnceOnlyError:
            snapshot = None
    return fail_write(claimed, claimed.fingerprint, claimed.token, summary, snapshot, max_attempts)
