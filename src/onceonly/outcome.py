# SPDX-License-Identifier: MIT
"""What processing a delivery returns, and the rules both modes share for replays and
failures (one place, so the inbox and leased mode cannot drift apart)."""

from __future__ import annotations

import collections
import datetime as dt
import os
import secrets
import struct
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from onceonly._core import codec, error_text
from onceonly._core.lateness import replay_lateness
from onceonly._core.state import Record, Write, cached_error_write, fail_write, one_step_init
from onceonly.errors import (
    ConfigurationError,
    CorruptRecord,
    EncodingError,
    OnceOnlyError,
    ReplayedError,
)

__all__ = ["Outcome", "Replay"]

T = TypeVar("T")


@dataclass(frozen=True)
class Replay:
    """What :meth:`onceonly.LeasedRunner.acquire` returns for a completed key: replay it.

    Attributes:
        record: the completed record (``result`` holds the stored outcome).
        now: the store's clock when the replay was decided (``None``: not known).

    .. versionadded:: 0.4
    """

    record: Record
    now: float | None = field(default=None, compare=False)

    def lateness(self) -> tuple[float | None, float | None]:
        """``(lateness, ttl)`` of this duplicate in seconds (see
        :func:`onceonly._core.lateness.replay_lateness`); ``(None, None)`` without ``now``."""
        return (None, None) if self.now is None else replay_lateness(self.record, self.now)


@one_step_init
@dataclass(frozen=True)
class Outcome(Generic[T]):
    """The result of processing one delivery.

    Attributes:
        result: the handler's result (decoded from the store when ``replayed``).
        replayed: true when the handler did not run because the key had completed.
        key: the idempotency key.
        attempt: the 1-based attempt that produced the result (0 in a batch outcome
            that carries an error).
        error: in an outcome of ``process_batch``, the exception this message ended
            with (the handler's, or :class:`~onceonly.PayloadMismatch`,
            :class:`~onceonly.DeadLettered`, :class:`~onceonly.InFlight`,
            :class:`~onceonly.InvalidKey`…); ``None`` when it ran or replayed.
            ``process`` raises instead.
        lateness: when ``replayed``, the seconds from the record's completion to this
            duplicate on the store's clock (``None`` otherwise, or not known).
        ttl: when ``replayed``, the record's ttl in seconds (``None``: kept for ever).

    .. versionadded:: 0.1
    .. versionchanged:: 0.3 ``error``.
    .. versionchanged:: 0.4 ``lateness`` and ``ttl``.
    """

    result: T
    replayed: bool
    key: str
    attempt: int
    error: BaseException | None = None
    lateness: float | None = field(default=None, compare=False)
    ttl: float | None = field(default=None, compare=False)

    @property
    def ok(self) -> bool:
        """Whether the message ran or replayed (no ``error``)."""
        return self.error is None


# The longest duration a store can hold as a lease or ttl (about 100 years): PostgreSQL's
# timestamps end in 294276 AD, but a "forever" is spelled None, not timedelta.max.
MAX_SECONDS = 100 * 366 * 86400.0


def seconds(
    value: float | dt.timedelta | None,
    *,
    what: str,
    allow_none: bool = False,
    allow_inf: bool = False,
    allow_zero: bool = False,
) -> float:
    """``value`` in seconds; :class:`ConfigurationError` unless positive and storable.

    Durations past :data:`MAX_SECONDS` are refused (use ``None`` for "for ever" where the
    option allows it); with ``allow_inf``, ``float("inf")`` means "no limit" (waits);
    with ``allow_zero``, 0 is accepted too (a wait of 0: answer at once).
    """
    if value is None:
        if allow_none:
            return float("inf")
        raise ConfigurationError(f"{what} is required")
    if isinstance(value, (bool, str, bytes)):
        raise ConfigurationError(f"{what} must be a number of seconds, not {value!r}")
    try:
        out = value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigurationError(f"{what} must be a number of seconds, not {value!r}") from None
    if allow_zero and out == 0:
        return 0.0
    if not out > 0:
        raise ConfigurationError(
            f"{what} must be {'zero or ' if allow_zero else ''}positive, not {value!r}"
        )
    if out > MAX_SECONDS and allow_inf:
        return float("inf")  # a wait that long is no limit
    if out > MAX_SECONDS:
        raise ConfigurationError(
            f"{what} must be at most {MAX_SECONDS:.0f} seconds (about 100 years), not "
            f"{value!r}" + ("; use None to keep it for ever" if what == "ttl" else "")
        )
    return out


def random_fraction() -> float:
    """A number in ``[0, 1)`` for backoff jitter (not for security)."""
    return secrets.randbits(53) / (1 << 53)


# Fencing tokens are drawn from the OS's CSPRNG in bulk (one getrandom call per
# _TOKEN_BATCH tokens, not one per token). A deque's popleft is atomic, so threads never
# share a token; a forked child drops the buffer it inherited, or parent and child would
# hand out the same tokens.
_TOKEN_BATCH = 256
_TOKEN_MASK = (1 << 63) - 1
_token_buffer: collections.deque[int] = collections.deque()
_unpack_tokens = struct.Struct(f"<{_TOKEN_BATCH}Q").unpack


def _drop_tokens() -> None:
    _token_buffer.clear()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_drop_tokens)


def new_token() -> int:
    """A fresh fencing token: 63 random bits, so a token is never reused for a key,
    even after its record was purged and claimed again.

    The bits come from ``os.urandom`` (as ``secrets`` does), read in bulk; every token
    is handed out once per process.
    """
    try:
        token = _token_buffer.popleft()
    except IndexError:
        _token_buffer.extend(v & _TOKEN_MASK for v in _unpack_tokens(os.urandom(8 * _TOKEN_BATCH)))
        return new_token()
    return token or 1


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
        exc = error_text.decode_error(record.result, cache_errors)
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
    summary = error_text.error_summary(exc)
    if isinstance(exc, cache_errors):
        return cached_error_write(claimed, summary, error_text.encode_error(exc), ttl)
    snapshot = None
    if keep_payload and payload is not None:
        try:
            snapshot = codec.encode(payload, max_bytes=max_bytes, what="payload")
        except OnceOnlyError:
            snapshot = None
    return fail_write(claimed, claimed.fingerprint, claimed.token, summary, snapshot, max_attempts)
