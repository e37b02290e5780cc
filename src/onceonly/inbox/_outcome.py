# SPDX-License-Identifier: MIT
"""What processing a delivery returns, and the rules both modes share for replays and
failures (one place, so the inbox and leased mode cannot drift apart)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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
from onceonly.messaging import Delivery

__all__ = ["BatchItem", "BatchMessage", "Outcome", "Replay"]

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


@dataclass(frozen=True)
class BatchItem:
    """One delivery of a batch: its key, payload and (optionally) broker metadata.

    A ``(key, payload)`` or ``(key, payload, delivery)`` tuple does as well.

    .. versionadded:: 0.3
    """

    key: str
    payload: Any
    delivery: Delivery | None = None


@dataclass(frozen=True)
class BatchMessage:
    """A new message of a batch, as a batch handler receives it
    (``process_batch(items, batch_handler=...)``): claimed in the batch's transaction,
    not a replay.

    Attributes:
        key: its idempotency key.
        payload: its body.
        attempt: 1 for its first run, 2 for its first retry, …
        delivery: its broker metadata, when a broker consumer hands it in.

    .. versionadded:: 0.6
    """

    key: str
    payload: Any
    attempt: int
    delivery: Delivery | None = None


def batch_items(items: Iterable[BatchItem | Sequence[Any]]) -> list[BatchItem]:
    """The deliveries of a batch as :class:`BatchItem` (tuples accepted).

    Raises:
        ConfigurationError: an item is not a ``BatchItem`` or a 2- or 3-tuple.
    """
    out = []
    for n, item in enumerate(items):
        if isinstance(item, BatchItem):
            out.append(item)
        elif isinstance(item, (tuple, list)) and len(item) in (2, 3):
            out.append(BatchItem(*item))
        else:
            raise ConfigurationError(
                f"batch item {n} must be a BatchItem or a (key, payload[, delivery]) tuple,"
                f" not {type(item).__name__}"
            )
    return out
