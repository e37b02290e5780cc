# SPDX-License-Identifier: MIT
"""What :class:`onceonly.Admin` and :class:`onceonly.AsyncAdmin` share: finding a
store's admin side, the reports, and the :class:`DuplicateCounter` listener."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from onceonly._core.admin import BUCKET_SECONDS, ScopeStats
from onceonly.errors import ConfigurationError
from onceonly.events import Event, EventKind
from onceonly.types import AdminStore, AsyncAdminStore, Store

__all__ = [
    "DuplicateCounter",
    "DuplicatePoint",
    "PurgeReport",
    "ReapReport",
    "StatsReport",
    "admin_store",
    "admin_store_async",
]

log = logging.getLogger("onceonly.admin")


def admin_store(store: Any) -> AdminStore:
    """The :class:`~onceonly.types.AdminStore` side of ``store``.

    Args:
        store: a sync store with an ``admin()`` method (memory, SQLite) or a
            PostgreSQL store.

    Returns:
        Its admin side.

    Raises:
        ConfigurationError: the store offers no operator access (an async store: open
            the same URL with ``open_store``).

    .. versionadded:: 0.2
    """
    admin = getattr(store, "admin", None)
    if callable(admin):
        found: AdminStore = admin()
        return found
    if type(store).__name__ == "PostgresStore":
        from onceonly.stores.postgres_admin import PostgresAdmin

        return PostgresAdmin(store)
    raise ConfigurationError(
        f"{type(store).__name__} has no operator access; open the URL with open_store()"
    )


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


def admin_store_async(store: Any) -> AsyncAdminStore:
    """The :class:`~onceonly.types.AsyncAdminStore` side of an async ``store``.

    Args:
        store: an async PostgreSQL store, or an async store opened on SQLite or memory
            (whose sync admin side then runs in a thread).

    Returns:
        Its admin side.

    Raises:
        ConfigurationError: the store offers no operator access.

    .. versionadded:: 0.2
    """
    admin = getattr(store, "admin", None)
    if callable(admin):  # an async store with its own admin side (AsyncTieredStore)
        found: AsyncAdminStore = admin()
        return found
    if type(store).__name__ == "AsyncPostgresStore":
        from onceonly.stores.postgres_admin_async import AsyncPostgresAdmin

        return AsyncPostgresAdmin(store)
    sync = getattr(store, "sync", None)
    if sync is not None:
        from onceonly.stores.threaded_admin import ThreadedAdmin

        return ThreadedAdmin(admin_store(sync))
    raise ConfigurationError(
        f"{type(store).__name__} has no operator access; open the URL with open_async_store()"
    )


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
