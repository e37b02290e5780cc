# SPDX-License-Identifier: MIT
"""What :class:`onceonly.Admin` and :class:`onceonly.AsyncAdmin` share: finding a
store's admin side, the reports, and the :class:`DuplicateCounter` listener."""

from __future__ import annotations

import atexit
import inspect
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from onceonly._core.admin import BUCKET_SECONDS, ScopeStats
from onceonly._core.lateness import DUPLICATE_BINS, RAN, UNKNOWN, lateness_bin, max_ttl
from onceonly.errors import ConfigurationError
from onceonly.events import Event, EventKind
from onceonly.types import AdminStore, AsyncAdminStore, AsyncStore, Store

__all__ = [
    "DuplicateCounter",
    "DuplicatePoint",
    "DuplicateRecorder",
    "LatenessReport",
    "PurgeReport",
    "ReapReport",
    "StatsReport",
    "admin_store",
    "admin_store_async",
]

log = logging.getLogger("onceonly.admin")


def admin_store(store: Store) -> AdminStore:
    """The :class:`~onceonly.types.AdminStore` side of ``store`` (``store.admin()``).

    Args:
        store: a sync store.

    Returns:
        Its admin side.

    Raises:
        ConfigurationError: the store offers no operator access (Redis), or is an async
            store (use :class:`~onceonly.AsyncAdmin`).

    .. versionadded:: 0.2
    """
    if inspect.iscoroutinefunction(store.migrate):
        raise ConfigurationError(
            f"{type(store).__name__} is an async store: use AsyncAdmin, or open the URL"
            " with open_store()"
        )
    return store.admin()


@dataclass(frozen=True)
class PurgeReport:
    """What a purge did (or, in a dry run, would do).

    Attributes:
        deleted: records deleted (dry run: records that qualify now).
        batches: delete statements run.
        seconds: wall time.
        dry_run: whether nothing was deleted.
    """

    deleted: int
    batches: int
    seconds: float
    dry_run: bool = False


@dataclass(frozen=True)
class ReapReport:
    """What a reap did.

    Attributes:
        reaped: lapsed ``in_progress`` records moved to ``failed``.
        skipped: lapsed records a worker renewed, completed or held meanwhile.
        seconds: wall time.
    """

    reaped: int
    skipped: int
    seconds: float


@dataclass(frozen=True)
class StatsReport:
    """A store's per-scope stats, read at ``now`` (store clock).

    Attributes:
        scopes: one entry per scope, sorted.
        now: the store's clock, epoch seconds.
        sizes: bytes on disk by part (``table``/``indexes`` on PostgreSQL, ``file`` on
            SQLite), empty when unknown.
    """

    scopes: list[ScopeStats]
    now: float
    sizes: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class DuplicatePoint:
    """Deliveries counted by a :class:`DuplicateCounter` in one interval.

    Attributes:
        start: the interval's start, epoch seconds.
        seconds: its length.
        counts: ``(claims, replays)`` per scope (scopes with nothing counted absent).

    .. versionadded:: 0.3
    """

    start: float
    seconds: float
    counts: dict[str, tuple[int, int]]

    def rate(self, scope: str) -> float | None:
        """``replays / claims`` of ``scope`` in the interval (``None``: none counted)."""
        claims, replays = self.counts.get(scope, (0, 0))
        return replays / claims if claims else None


def admin_store_async(store: AsyncStore) -> AsyncAdminStore:
    """The :class:`~onceonly.types.AsyncAdminStore` side of an async ``store``
    (``store.admin()``; on SQLite or memory the sync admin side runs in a thread).

    Args:
        store: an async store.

    Returns:
        Its admin side.

    Raises:
        ConfigurationError: the store offers no operator access (Redis), or is a sync
            store (use :class:`~onceonly.Admin`).

    .. versionadded:: 0.2
    """
    if not inspect.iscoroutinefunction(store.migrate):
        raise ConfigurationError(
            f"{type(store).__name__} is a sync store: use Admin, or open the URL with"
            " open_async_store()"
        )
    return store.admin()


class DuplicateCounter:
    """A listener counting claims and replays per scope for ``onceonly stats``'s
    duplicate rate, without a write on the delivery path.

    Counts are kept in memory and added to the store's counters once per
    ``flush_seconds`` (one upsert per scope and minute bucket, by whichever delivery
    comes due; its errors are logged). Rows are per process and per minute, so no row is
    hot: a replay never writes. Up to ``flush_seconds`` of counts are lost if the
    process dies; call :meth:`flush` at shutdown.

    Args:
        store: a sync store (the counters table sits beside its records table).
        flush_seconds: how often counts are written.

    .. versionadded:: 0.2
    """

    def __init__(self, store: Store, *, flush_seconds: float = 60.0) -> None:
        self.records = admin_store(store)
        self.flush_seconds = flush_seconds
        self._pending: dict[tuple[str, int], list[int]] = {}
        self._lock = threading.Lock()
        self._due = time.monotonic() + flush_seconds

    def __call__(self, event: Event) -> None:
        if event.kind not in (EventKind.COMPLETED, EventKind.FAILED, EventKind.REPLAYED):
            return
        bucket = int(time.time() // BUCKET_SECONDS * BUCKET_SECONDS)
        with self._lock:
            row = self._pending.setdefault((event.scope, bucket), [0, 0])
            row[0] += 1
            row[1] += event.kind is EventKind.REPLAYED
            due = time.monotonic() >= self._due
        if due:
            self.flush()

    def flush(self) -> None:
        """Write the counts held in memory now."""
        with self._lock:
            pending, self._pending = self._pending, {}
            self._due = time.monotonic() + self.flush_seconds
        if not pending:
            return
        rows = sorted((scope, bucket, c, r) for (scope, bucket), (c, r) in pending.items())
        try:
            self.records.add_counts(rows)
        except Exception:
            log.exception("could not store delivery counters; %d rows dropped", len(rows))


# Rows kept in memory while the store cannot be written: beyond this, counts are dropped
# (and the number logged) rather than grow without bound during a long outage.
_MAX_PENDING = 100_000


class DuplicateRecorder:
    """A listener recording when duplicates arrive: per scope, minute and lateness bin,
    the deliveries that ran and the duplicates replayed (how late after the record
    completed, against its ttl), for the dashboard's lateness histogram and duplicate
    rate (docs/operating.md, "Dashboard"; spec §8.4).

    Each event only adds to a counter in memory: the delivery path never writes. A
    background thread writes the counts once per ``flush_seconds`` (one upsert per
    scope, minute and bin, added to what other processes wrote) and :meth:`close` writes
    the rest. A failed write is logged and its counts kept for the next one (up to
    100,000 rows); it never reaches a handler. A process that dies loses at most the
    last ``flush_seconds`` of counts.

    The lateness comes with the replay (the store's now at the decision minus the
    record's ``completed_at``), so recording costs no extra round trip. A duplicate
    arriving after the ttl is not a replay (the record behaves as absent and the handler
    runs again): it is counted as a run. Supported on the SQL stores and memory (a
    ``<table>_lateness`` table beside the records, created on the first write); not on
    Redis.

    Args:
        store: a sync store (for an async application, open the same URL with
            :func:`onceonly.open_store`).
        flush_seconds: how often counts are written.
        background: start the thread that flushes (``False``: call :meth:`flush`).

    Raises:
        ConfigurationError: ``flush_seconds`` is not positive, or the store offers no
            operator access (Redis).

    .. versionadded:: 0.4
    """

    def __init__(
        self, store: Store, *, flush_seconds: float = 60.0, background: bool = True
    ) -> None:
        if not flush_seconds > 0:
            raise ConfigurationError("flush_seconds must be positive")
        self.records = admin_store(store)
        self.flush_seconds = flush_seconds
        self._pending: dict[tuple[str, int, int], list[Any]] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(
                target=self._loop, name="onceonly-duplicate-recorder", daemon=True
            )
            self._thread.start()
            atexit.register(self.close)

    def __call__(self, event: Event) -> None:
        kind = event.kind
        if kind is EventKind.REPLAYED:
            b, ttl = lateness_bin(event.lateness, event.ttl), event.ttl
        elif kind is EventKind.COMPLETED or kind is EventKind.FAILED:
            b, ttl = RAN, None
        else:
            return
        self._add(event.scope, int(time.time()) // BUCKET_SECONDS * BUCKET_SECONDS, b, 1, ttl)

    def _add(self, scope: str, bucket: int, b: int, n: int, ttl: float | None) -> bool:
        with self._lock:
            row = self._pending.get((scope, bucket, b))
            if row is None:
                if len(self._pending) >= _MAX_PENDING:
                    return False
                self._pending[(scope, bucket, b)] = [n, ttl]
            else:
                row[0] += n
                row[1] = max_ttl(row[1], ttl)
        return True

    def _loop(self) -> None:
        while not self._closed.wait(self.flush_seconds):
            self.flush()

    def flush(self) -> int:
        """Write the counts held in memory now (errors are logged, not raised).

        Returns:
            The rows written (0 when there was nothing or the write failed).
        """
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return 0
        rows = sorted((s, t, b, n, ttl) for (s, t, b), (n, ttl) in pending.items())
        try:
            self.records.add_lateness(rows)
        except Exception:
            dropped = sum(n for s, t, b, n, ttl in rows if not self._add(s, t, b, n, ttl))
            log.exception(
                "could not store duplicate lateness; %d rows kept for the next flush,"
                " %d counts dropped", len(rows), dropped,
            )  # fmt: skip
            return 0
        return len(rows)

    def close(self) -> None:
        """Stop the background thread and write what is left."""
        self._closed.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            atexit.unregister(self.close)
            if thread is not threading.current_thread():
                thread.join()
        self.flush()

    def __enter__(self) -> DuplicateRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class LatenessReport:
    """What a :class:`DuplicateRecorder` recorded over a window (see
    :meth:`onceonly.Admin.duplicate_lateness`).

    Attributes:
        bins: duplicates per lateness bin, every scope (or the one asked) together;
            bin numbers and labels in :mod:`onceonly._core.lateness`.
        by_scope: the same per scope.
        ttl: the largest ttl (seconds) of the records replayed, per scope (``None``:
            kept for ever).
        points: deliveries and duplicates per scope and interval, oldest first (the
            duplicate rate over time; ``claims`` counts runs and duplicates).
        window: seconds covered.

    .. versionadded:: 0.4
    """

    bins: dict[int, int]
    by_scope: dict[str, dict[int, int]]
    ttl: dict[str, float | None]
    points: list[DuplicatePoint]
    window: float

    @property
    def recorded(self) -> bool:
        """Whether anything was recorded in the window."""
        return any(p.counts for p in self.points)

    @property
    def duplicates(self) -> int:
        """Duplicates in the window."""
        return sum(self.bins.values())

    @classmethod
    def from_rows(
        cls,
        rows: list[tuple[str, int, int, int, float | None]],
        starts: list[int],
        step: int,
        window: float,
    ) -> LatenessReport:
        """Build the report from a store's ``read_lateness`` rows.

        Args:
            rows: ``(scope, start, bin, n, ttl)`` rows.
            starts: the intervals' starts (multiples of ``step``), oldest first.
            step: the intervals' length in seconds.
            window: seconds covered.

        Returns:
            The report (rows outside the intervals are left out).
        """
        index = {start: i for i, start in enumerate(starts)}
        counts: list[dict[str, list[int]]] = [{} for _ in starts]
        bins = dict.fromkeys((*DUPLICATE_BINS, UNKNOWN), 0)
        by_scope: dict[str, dict[int, int]] = {}
        ttl: dict[str, float | None] = {}
        for scope, start, b, n, row_ttl in rows:
            i = index.get(start)
            if i is None:
                continue
            pair = counts[i].setdefault(scope, [0, 0])
            pair[0] += n
            if b == RAN:
                continue
            pair[1] += n
            bins[b] = bins.get(b, 0) + n
            mine = by_scope.setdefault(scope, dict.fromkeys((*DUPLICATE_BINS, UNKNOWN), 0))
            mine[b] = mine.get(b, 0) + n
            ttl[scope] = max_ttl(ttl.get(scope), row_ttl)
        points = [
            DuplicatePoint(float(start), float(step), {s: (c, r) for s, (c, r) in got.items()})
            for start, got in zip(starts, counts, strict=True)
        ]
        return cls(bins, by_scope, ttl, points, window)
