# SPDX-License-Identifier: MIT
"""An in-process store for tests and examples (``memory://``).

Records live in a dict guarded by one lock. A transaction holds a per-key lock on every
key it claims until it ends (so a concurrent duplicate waits, like a row lock in
PostgreSQL) and buffers its writes, applying them on commit and dropping them on
rollback. The clock is injectable (see :class:`onceonly.testing.ManualClock`).
It has no SQL: ``execute`` raises :class:`~onceonly.ConfigurationError`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from onceonly._core.state import Expect, Record, State, Write
from onceonly.errors import ConfigurationError, InFlight, OnceOnlyError
from onceonly.stores._outbox_sql import no_outbox
from onceonly.types import Listener, OutboxStatements, Params, ReplayCache, Snapshot, TxHealth

if TYPE_CHECKING:
    from onceonly.stores.memory._admin import MemoryAdmin

__all__ = ["MemoryStore"]

_Key = tuple[str, str]


def apply_write(scope: str, key: str, write: Write, now: float, old: Record | None) -> Record:
    """The record that results from storing ``write`` at ``now`` over ``old``."""
    return Record(
        scope=scope,
        key=key,
        state=write.state,
        fingerprint=write.fingerprint,
        token=write.token,
        attempts=write.attempts,
        lease_until=None if write.lease_seconds is None else now + write.lease_seconds,
        result=write.result,
        error=write.error,
        payload=write.payload,
        checkpoint=(
            old.checkpoint if write.keep_checkpoint and old is not None else write.checkpoint
        ),
        created_at=old.created_at if old is not None else now,
        updated_at=now,
        completed_at=now if write.completed else None,
        expires_at=None if write.ttl_seconds is None else now + write.ttl_seconds,
    )


class MemorySession:
    """A session of :class:`MemoryStore`; buffered when inside a transaction.

    A transaction joined to another (``store.transaction(connection=session)``) is a
    savepoint: it reads through its parent, its commit moves its writes into the
    parent's buffer, and its rollback drops only its own; key locks belong to the
    outermost transaction.
    """

    def __init__(
        self,
        store: MemoryStore,
        *,
        transactional: bool,
        lock_wait: float,
        parent: MemorySession | None = None,
    ) -> None:
        self._store = store
        self._transactional = transactional
        self._lock_wait = lock_wait
        self._parent = parent
        self._pending: dict[_Key, Record] = {}
        self._held: list[threading.Lock] = []

    @property
    def connection(self) -> Any:
        """What ``transaction(connection=…)`` joins: this transaction (autocommit: the
        store)."""
        return self if self._transactional else self._store

    def execute(self, sql: str, params: Params = None) -> Any:
        raise ConfigurationError("the memory store has no SQL; use a SQL store for tx.execute()")

    def health(self) -> TxHealth:
        return TxHealth.OK

    # -- reads see this transaction's own writes first
    def _read(self, k: _Key) -> Record | None:
        if k in self._pending:
            return self._pending[k]
        if self._parent is not None:
            return self._parent._read(k)
        return self._store._records.get(k)

    def _lock_key(self, k: _Key) -> None:
        if not self._transactional:
            return
        if self._parent is not None:
            self._parent._lock_key(k)
            return
        lock = self._store._key_lock(k)
        if lock in self._held:
            return
        wait = -1 if self._lock_wait == float("inf") else self._lock_wait  # -1: no limit
        if not lock.acquire(timeout=wait):
            raise InFlight(
                "another transaction holds this key", scope=k[0], key=k[1], retry_after=None
            )
        self._held.append(lock)

    def _put(self, k: _Key, record: Record) -> None:
        if self._transactional:
            self._pending[k] = record
        else:
            self._store._records[k] = record

    def claim(self, scope: str, key: str, write: Write) -> Snapshot:
        k = (scope, key)
        self._lock_key(k)
        with self._store._lock:
            now = self._store.clock()
            current = self._read(k)
            if current is not None:
                return Snapshot(current, now)
            record = apply_write(scope, key, write, now, None)
            self._put(k, record)
            return Snapshot(record, now, inserted=True)

    def get(self, scope: str, key: str) -> Snapshot:
        with self._store._lock:
            return Snapshot(self._read((scope, key)), self._store.clock())

    def update(self, scope: str, key: str, expect: Expect, write: Write) -> Record | None:
        k = (scope, key)
        self._lock_key(k)
        with self._store._lock:
            current = self._read(k)
            now = self._store.clock()
            if not expect.matches(current, now):
                return None
            record = apply_write(scope, key, write, now, current)
            self._put(k, record)
            return record

    def insert(self, scope: str, key: str, write: Write) -> Record | None:
        snap = self.claim(scope, key, write)
        return snap.record if snap.inserted else None

    def renew(self, scope: str, key: str, token: int, lease_seconds: float) -> float | None:
        k = (scope, key)
        with self._store._lock:
            current = self._read(k)
            if current is None or current.token != token or current.state is not State.IN_PROGRESS:
                return None
            until = self._store.clock() + lease_seconds
            self._put(k, _replace(current, lease_until=until))
            return until

    def save_checkpoint(
        self, scope: str, key: str, token: int, checkpoint: str, lease_seconds: float | None = None
    ) -> bool:
        k = (scope, key)
        with self._store._lock:
            current = self._read(k)
            if current is None or current.token != token or current.state is not State.IN_PROGRESS:
                return False
            now = self._store.clock()
            until = current.lease_until if lease_seconds is None else now + lease_seconds
            self._put(
                k, _replace(current, checkpoint=checkpoint, updated_at=now, lease_until=until)
            )
            return True

    # -- transaction end
    def _finish(self, commit: bool) -> None:
        if self._parent is not None:  # a savepoint: into the parent, or dropped
            if commit:
                self._parent._pending.update(self._pending)
            self._pending.clear()
            return
        try:
            if commit and self._pending:
                with self._store._lock:
                    self._store._records.update(self._pending)
        finally:
            self._pending.clear()
            for lock in self._held:
                lock.release()
            self._held.clear()


def _replace(record: Record, **changes: Any) -> Record:
    import dataclasses

    return dataclasses.replace(record, **changes)


class MemoryStore:
    """Records in process memory. Not shared between processes; lost on exit.

    Args:
        clock: returns the store's now in epoch seconds (default ``time.time``).
    """

    atomic = True
    dialect = "memory"
    outbox_table: str | None = None  # no SQL, no outbox
    latest_schema_version: int | None = None  # no tables
    replay_cache: ReplayCache | None = None  # no records kept in the process

    def __init__(self, *, clock: Callable[[], float] | None = None, url: str = "memory://") -> None:
        self.url = url
        self.clock: Callable[[], float] = clock or time.time
        self._records: dict[_Key, Record] = {}
        self._lock = threading.Lock()
        self._key_locks: dict[_Key, threading.Lock] = {}
        self._counts: dict[tuple[str, int], list[int]] = {}  # delivery counters (admin)
        # duplicate lateness (admin): (scope, bucket, bin) -> [n, ttl]
        self._lateness: dict[tuple[str, int, int], list[Any]] = {}

    def _key_lock(self, k: _Key) -> threading.Lock:
        with self._lock:
            lock = self._key_locks.get(k)
            if lock is None:
                lock = self._key_locks[k] = threading.Lock()
            return lock

    @property
    def connection_source(self) -> Hashable:
        """This store.

        See :attr:`onceonly.types.Store.connection_source`.
        """
        return self

    def migrate(self) -> None:
        """Nothing to create; present for the common contract."""

    def schema_version(self) -> int | None:
        """``None``: no tables."""
        return None

    @property
    def pool_size(self) -> int | None:
        """``None``: no connections."""
        return None

    @contextmanager
    def transaction(
        self, connection: Any = None, *, lock_wait: float = 5.0
    ) -> Iterator[MemorySession]:
        parent = None
        if isinstance(connection, MemorySession) and connection._store is self:
            if not connection._transactional:
                raise ConfigurationError("the session is not inside a transaction")
            parent = connection
        elif connection is not None and connection is not self:
            raise ConfigurationError("the memory store cannot join a foreign connection")
        session = MemorySession(self, transactional=True, lock_wait=lock_wait, parent=parent)
        try:
            yield session
        except BaseException:
            session._finish(commit=False)
            raise
        session._finish(commit=True)

    @contextmanager
    def session(self) -> Iterator[MemorySession]:
        yield MemorySession(self, transactional=False, lock_wait=0.0)

    def records(self) -> list[Record]:
        """Every committed record (for tests and inspection)."""
        with self._lock:
            return list(self._records.values())

    def admin(self) -> MemoryAdmin:
        """Operator access to the records (:class:`~onceonly.types.AdminStore`).

        .. versionadded:: 0.2
        """
        from onceonly.stores.memory._admin import MemoryAdmin

        return MemoryAdmin(self)

    def outbox_statements(self, table: str) -> OutboxStatements:
        """Refused: the outbox is a table written in the caller's SQL transaction.

        Raises:
            ConfigurationError: always.
        """
        raise no_outbox(self)

    def translate(self, exc: BaseException) -> OnceOnlyError | None:
        """``None``: the memory store has no driver."""
        return None

    def listen(self, channel: str) -> Listener | None:
        """``None``: no notifications."""
        return None

    def renew_connections(self) -> None:
        """Nothing: no connections."""

    def close(self) -> None:
        """Nothing to release."""


if TYPE_CHECKING:  # the contract is checked statically
    from onceonly.types import Store

    _contract: type[Store] = MemoryStore
