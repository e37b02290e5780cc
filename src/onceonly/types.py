# SPDX-License-Identifier: MIT
"""The store contract: the few record operations every backend provides.

A store hands out *sessions*. A session is one connection, either inside a
transaction (``store.transaction()``: atomic mode, the handler's writes share it) or
in autocommit (``store.session()``: leased mode, each operation commits on its own).
Every operation is a single round trip. All semantics (what to write, when) live in
``onceonly._core.state``; a store only reads and conditionally writes rows, stamping
times from **its own clock**.

Sync and async contracts have the same method names; ``AsyncStore``/``AsyncSession``
are awaited.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from onceonly._core.admin import PurgeRule, Query, ScopeStats
from onceonly._core.state import Expect, Record, Write, one_step_init

__all__ = [
    "AdminStore",
    "AsyncAdminStore",
    "AsyncSession",
    "AsyncStore",
    "Session",
    "Snapshot",
    "Store",
    "TxHealth",
]

Params = Sequence[Any] | None


@one_step_init
@dataclass(frozen=True)
class Snapshot:
    """A record (or its absence) read together with the store's clock.

    ``inserted`` is true when the read was a claim that inserted this record.
    """

    record: Record | None
    now: float
    inserted: bool = False


class TxHealth(str, enum.Enum):
    """What a session's transaction looks like after a handler ran in it (no I/O).

    ``OK``: still ours and usable. ``ENDED``: committed or rolled back by someone else
    (the handler). ``ABORTED``: a statement failed; it can only roll back. ``LOST``: the
    connection is gone (transient: never the message's fault).
    """

    OK = "ok"
    ENDED = "ended"
    ABORTED = "aborted"
    LOST = "lost"


class Session(Protocol):
    """One connection of a sync store (see the module docstring)."""

    @property
    def connection(self) -> Any:
        """The driver connection (``sqlite3.Connection``, ``psycopg.Connection``, …)."""

    def execute(self, sql: str, params: Params = None) -> Any:
        """Run the caller's SQL (``?`` placeholders) on this session; returns a cursor."""

    def claim(self, scope: str, key: str, write: Write) -> Snapshot:
        """Insert ``write`` if ``(scope, key)`` is absent; else return the current record.

        In a transaction, a concurrent uncommitted claim of the same key is waited for
        (up to the transaction's lock wait, then :class:`~onceonly.InFlight`).
        """

    def get(self, scope: str, key: str) -> Snapshot:
        """Read the record of ``(scope, key)``."""

    def health(self) -> TxHealth:
        """The state of this session's transaction, read locally (no round trip)."""

    def update(self, scope: str, key: str, expect: Expect, write: Write) -> Record | None:
        """Store ``write`` if the record is still the version ``expect`` (its token, its
        state and, with ``expect.lapsed``, a lapsed lease or expiry on the store's
        clock, all checked in the same statement); else ``None``."""

    def insert(self, scope: str, key: str, write: Write) -> Record | None:
        """Insert ``write`` if ``(scope, key)`` is absent; else ``None``."""

    def renew(self, scope: str, key: str, token: int, lease_seconds: float) -> float | None:
        """Extend an ``in_progress`` claim held under ``token``; the new ``lease_until``."""

    def save_checkpoint(
        self, scope: str, key: str, token: int, checkpoint: str, lease_seconds: float | None = None
    ) -> bool:
        """Store the checkpoint text on an ``in_progress`` claim held under ``token``;
        with ``lease_seconds``, extend its lease as a renewal would."""


class Store(Protocol):
    """A sync store of records."""

    url: str
    atomic: bool  # whether transaction() can hold the caller's SQL writes

    @property
    def connection_source(self) -> Hashable:
        """What this store's connections come from: the SQLite file, the connection pool,
        the store itself. Two stores with equal sources share their connections (or a
        single writer), so a call on one made while a transaction of the other is open
        can wait for itself: an ``@idempotent`` call inside an atomic handler is refused
        when their sources are equal (a :class:`~onceonly.stores.tiered._store.TieredStore`
        gives its durable store's).

        .. versionadded:: 0.5
        """

    def migrate(self) -> None:
        """Create or upgrade the tables; safe to repeat and to run concurrently."""

    def transaction(
        self, connection: Any = None, *, lock_wait: float = 5.0
    ) -> AbstractContextManager[Session]:
        """A session inside one transaction, committed on success, rolled back on error.

        With ``connection`` (already inside a transaction), the session joins it inside
        a savepoint and never commits it.
        """

    def session(self) -> AbstractContextManager[Session]:
        """An autocommit session: every operation commits on its own."""

    def close(self) -> None:
        """Release connections."""


class AsyncSession(Protocol):
    """One connection of an async store; the methods of :class:`Session`, awaited."""

    @property
    def connection(self) -> Any: ...

    async def execute(self, sql: str, params: Params = None) -> Any: ...

    async def claim(self, scope: str, key: str, write: Write) -> Snapshot: ...

    async def get(self, scope: str, key: str) -> Snapshot: ...

    def health(self) -> TxHealth: ...

    async def update(self, scope: str, key: str, expect: Expect, write: Write) -> Record | None: ...

    async def insert(self, scope: str, key: str, write: Write) -> Record | None: ...

    async def renew(
        self, scope: str, key: str, token: int, lease_seconds: float
    ) -> float | None: ...

    async def save_checkpoint(
        self, scope: str, key: str, token: int, checkpoint: str, lease_seconds: float | None = None
    ) -> bool: ...


class AsyncStore(Protocol):
    """An async store of records; the methods of :class:`Store`, awaited."""

    url: str
    atomic: bool

    @property
    def connection_source(self) -> Hashable: ...

    async def migrate(self) -> None: ...

    def transaction(
        self, connection: Any = None, *, lock_wait: float = 5.0
    ) -> AbstractAsyncContextManager[AsyncSession]: ...

    def session(self) -> AbstractAsyncContextManager[AsyncSession]: ...

    async def close(self) -> None: ...


class AdminStore(Protocol):
    """Operator access to a store's records, beside the claim path (``onceonly.admin._admin``).

    A store offers it through ``store.admin()``. Reads and deletes only: every fenced
    write (reap, redrive) goes through the store's own ``Session.update``, with the
    :class:`~onceonly._core.state.Expect` of the version it was decided from. Every
    operation is bounded (``limit``) and holds no lock beyond one short statement.

    .. versionadded:: 0.2
    """

    def scan(self, query: Query) -> tuple[list[Record], float]:
        """Records matching ``query`` in ``(scope, key)`` order, and the store's now."""

    def count_purgeable(self, rule: PurgeRule) -> int:
        """How many records :meth:`purge_batch` would delete now (for a dry run)."""

    def purge_batch(self, rule: PurgeRule, limit: int) -> int:
        """Delete at most ``limit`` records qualifying under ``rule`` in one short
        transaction, re-checking the rule on each row as it is deleted and skipping
        rows another transaction holds; the number deleted."""

    def delete(self, scope: str, key: str, expect: Expect) -> bool:
        """Delete the record if it is still the version ``expect`` (token and state)."""

    def stats(self, scope: str | None = None) -> tuple[list[ScopeStats], float]:
        """Per-scope counts (see :class:`~onceonly._core.admin.ScopeStats`) and now."""

    def sizes(self) -> dict[str, int]:
        """Bytes on disk by part (``table``, ``indexes``); empty when not known."""

    def add_counts(self, counts: Sequence[tuple[str, int, int, int]]) -> None:
        """Add ``(scope, bucket, claims, replays)`` rows to the delivery counters, one
        upsert per row (``bucket``: its start, epoch seconds)."""

    def read_counts(self, since: float) -> dict[str, tuple[int, int]]:
        """Claims and replays per scope, summed over buckets starting at or after
        ``since`` (epoch seconds)."""

    def add_lateness(self, rows: Sequence[tuple[str, int, int, int, float | None]]) -> None:
        """Add ``(scope, bucket, bin, n, ttl)`` rows to the duplicate-lateness table (one
        upsert per row, adding ``n`` and keeping the largest ``ttl``; see
        :mod:`onceonly._core.lateness` for the bins). Creates the table on first use."""

    def read_lateness(
        self, since: float, step: int
    ) -> list[tuple[str, int, int, int, float | None]]:
        """``(scope, start, bin, n, ttl)``: the counts of buckets starting at or after
        ``since``, summed per scope, bin and interval of ``step`` seconds (``start``: a
        multiple of ``step``), with the largest ttl; empty when nothing was recorded."""


class AsyncAdminStore(Protocol):
    """The methods of :class:`AdminStore`, awaited (for async stores).

    .. versionadded:: 0.2
    """

    async def scan(self, query: Query) -> tuple[list[Record], float]: ...

    async def count_purgeable(self, rule: PurgeRule) -> int: ...

    async def purge_batch(self, rule: PurgeRule, limit: int) -> int: ...

    async def delete(self, scope: str, key: str, expect: Expect) -> bool: ...

    async def stats(self, scope: str | None = None) -> tuple[list[ScopeStats], float]: ...

    async def sizes(self) -> dict[str, int]: ...

    async def add_counts(self, counts: Sequence[tuple[str, int, int, int]]) -> None: ...

    async def read_counts(self, since: float) -> dict[str, tuple[int, int]]: ...

    async def add_lateness(
        self, rows: Sequence[tuple[str, int, int, int, float | None]]
    ) -> None: ...

    async def read_lateness(
        self, since: float, step: int
    ) -> list[tuple[str, int, int, int, float | None]]: ...
