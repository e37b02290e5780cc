# SPDX-License-Identifier: MIT
"""Operating a store: retention, the reaper, inspection, redrive and stats (spec §8).

:class:`Admin` drives a store's :class:`~onceonly.types.AdminStore` side (bounded
reads and deletes) and its ordinary sessions (every fenced write). Which records
qualify and what is written is decided in ``onceonly._core.admin``; every write is
conditional on the version it was decided from (an ``Expect``), so a worker that
renews, completes or fails a record concurrently always wins over the operator.

.. versionadded:: 0.2
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from onceonly._core.admin import (
    BUCKET_SECONDS,
    PurgeRule,
    Query,
    ScopeStats,
    reap_decision,
    redrive_decision,
)
from onceonly._core.state import Expect, Record, State, Write
from onceonly.errors import ConfigurationError, InFlight
from onceonly.events import Event, EventKind
from onceonly.outcome import new_token
from onceonly.types import AdminStore, Store

__all__ = [
    "Admin",
    "DuplicateCounter",
    "PurgeReport",
    "ReapReport",
    "StatsReport",
    "admin_store",
]

log = logging.getLogger(__name__)

Progress = Callable[[int], None]


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


class Admin:
    """Operator operations on a sync store.

    Args:
        store: the store (``open_store(url)``).
        lock_wait: seconds a fenced write waits for a transaction holding the record
            before it skips it.

    Raises:
        ConfigurationError: the store offers no operator access.

    .. versionadded:: 0.2
    """

    def __init__(self, store: Store, *, lock_wait: float = 1.0) -> None:
        self.store = store
        self.records = admin_store(store)
        self.lock_wait = lock_wait

    # -- retention
    def purge(
        self,
        *,
        older_than: float = 0.0,
        include_dead: bool = False,
        scope: str | None = None,
        batch_size: int = 1000,
        pause: float = 0.1,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> PurgeReport:
        """Delete expired records in batches of ``batch_size``, pausing between them.

        Args:
            older_than: only records expired (failed/dead: last written) at least this
                many seconds ago.
            include_dead: delete ``failed`` and ``dead`` records too (kept by default,
                so an operator can redrive them).
            scope: only this scope.
            batch_size: records per delete statement (one short transaction each).
            pause: seconds between batches, leaving the database to the claim path.
            dry_run: count what qualifies; delete nothing.
            progress: called with the number deleted after each batch.

        Returns:
            A :class:`PurgeReport`.

        Raises:
            ConfigurationError: a negative ``older_than`` or a batch size below 1.
            StoreError: the store failed (batches already committed stay deleted).
        """
        if batch_size < 1:
            raise ConfigurationError("batch_size must be at least 1")
        rule = PurgeRule(older_than=older_than, include_dead=include_dead, scope=scope)
        started = time.monotonic()
        if dry_run:
            n = self.records.count_purgeable(rule)
            return PurgeReport(n, 0, time.monotonic() - started, dry_run=True)
        deleted = batches = 0
        while True:
            n = self.records.purge_batch(rule, batch_size)
            batches += 1
            deleted += n
            if progress is not None:
                progress(n)
            if n < batch_size:
                break
            time.sleep(pause)
        return PurgeReport(deleted, batches, time.monotonic() - started)

    # -- the reaper
    def reap(
        self,
        *,
        scope: str | None = None,
        batch_size: int = 1000,
        pause: float = 0.1,
        progress: Progress | None = None,
    ) -> ReapReport:
        """Move ``in_progress`` records whose lease lapsed to ``failed`` (one pass).

        Each write expects the version it was decided from, with the lease still lapsed
        on the store's clock; a worker that renews or completes first wins, and the
        record is counted as skipped. Safe to run from several hosts at once.

        Args:
            scope: only this scope.
            batch_size: records read per batch.
            pause: seconds between batches.
            progress: called with the number reaped after each batch.

        Returns:
            A :class:`ReapReport`.
        """
        started = time.monotonic()
        reaped = skipped = 0
        for batch, now in self._pages(Query(scope=scope, lapsed=True, limit=batch_size)):
            done = 0
            for record in batch:
                decision = reap_decision(record, now, new_token())
                if decision is not None and self._write(record, *decision):
                    done += 1
                else:
                    skipped += 1
            reaped += done
            if progress is not None:
                progress(done)
            if len(batch) == batch_size:
                time.sleep(pause)
        return ReapReport(reaped, skipped, time.monotonic() - started)

    # -- inspection
    def list_records(
        self,
        *,
        state: State | None = None,
        scope: str | None = None,
        older_than: float | None = None,
        limit: int = 100,
        after: tuple[str, str] | None = None,
    ) -> list[Record]:
        """Records in ``(scope, key)`` order, at most ``limit``.

        Args:
            state: only this state.
            scope: only this scope.
            older_than: only records last written at least this many seconds ago.
            limit: the most records returned.
            after: resume after this ``(scope, key)``.

        Returns:
            The records.
        """
        states = (state,) if state is not None else ()
        query = Query(states, scope, older_than, after=after, limit=limit)
        return self.records.scan(query)[0]

    def iter_records(self, query: Query) -> Iterator[Record]:
        """Every record matching ``query``, read ``query.limit`` at a time."""
        for batch, _ in self._pages(query):
            yield from batch

    def show(self, scope: str, key: str) -> Record | None:
        """The record of ``(scope, key)``, or ``None``."""
        with self.store.session() as s:
            return s.get(scope, key).record

    # -- redrive and delete
    def redrive(self, scope: str, key: str) -> Record | None:
        """Redrive a ``dead`` or ``failed`` record: ``failed`` with zero attempts under a
        new token, so the next delivery runs the handler again.

        Returns:
            The redriven record; ``None`` when absent, not dead/failed, or changed by a
            worker meanwhile.
        """
        record = self.show(scope, key)
        if record is None:
            return None
        decision = redrive_decision(record, new_token())
        if decision is None:
            return None
        return self._write(record, *decision)

    def redrive_all(self, *, state: State = State.DEAD, scope: str | None = None) -> int:
        """Redrive every record in ``state`` (dead or failed), in one scope or all.

        Returns:
            How many were redriven.
        """
        if state not in (State.DEAD, State.FAILED):
            raise ConfigurationError("only dead and failed records are redriven")
        done = 0
        for record in self.iter_records(Query((state,), scope, limit=500)):
            decision = redrive_decision(record, new_token())
            if decision is not None and self._write(record, *decision):
                done += 1
        return done

    def delete(self, scope: str, key: str, *, expect: Expect | None = None) -> bool:
        """Delete one record, if it is still the version read (or ``expect``).

        Returns:
            Whether it was deleted.
        """
        if expect is None:
            record = self.show(scope, key)
            if record is None:
                return False
            expect = Expect(record.token, record.state)
        return self.records.delete(scope, key, expect)

    # -- stats
    def stats(self, *, scope: str | None = None, window: float = 3600.0) -> StatsReport:
        """Counts by state, the oldest in-progress age and expired rows, per scope, with
        the claims and replays a :class:`DuplicateCounter` counted over ``window``
        seconds (its duplicate rate).

        Returns:
            A :class:`StatsReport`.
        """
        scopes, now = self.records.stats(scope)
        counted = self.records.read_counts(time.time() - window)
        if scope is not None:
            counted = {k: v for k, v in counted.items() if k == scope}
        known = {s.scope for s in scopes}
        scopes += [ScopeStats(name) for name in counted if name not in known]
        scopes = [
            dataclasses.replace(s, claims=counted[s.scope][0], replays=counted[s.scope][1])
            if s.scope in counted
            else s
            for s in sorted(scopes, key=lambda s: s.scope)
        ]
        return StatsReport(scopes, now, self.records.sizes())

    # -- helpers
    def _pages(self, query: Query) -> Iterator[tuple[list[Record], float]]:
        while True:
            batch, now = self.records.scan(query)
            if batch:
                yield batch, now
            if len(batch) < query.limit:
                return
            last = batch[-1]
            query = Query(
                query.states, query.scope, query.older_than, query.lapsed,
                (last.scope, last.key), query.limit,
            )  # fmt: skip

    def _write(self, record: Record, expect: Expect, write: Write) -> Record | None:
        """Store ``write`` over ``record`` if it is still the version ``expect``."""
        try:
            with self.store.transaction(lock_wait=self.lock_wait) as s:
                return s.update(record.scope, record.key, expect, write)
        except InFlight:  # a worker's transaction holds it: it wins
            return None


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
