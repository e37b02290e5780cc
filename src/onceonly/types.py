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

Beside the records, a store names what the rest of the library needs of it, so no caller
probes a store's attributes or its class name: its ``dialect``, its schema version, its
operator side (``admin()``), the statements of its outbox table
(``outbox_statements()``, an :class:`OutboxStatements`), the translation of its driver's
errors (``translate()``), its pool's size, and the wake-ups of an outbox relay
(``listen()``, ``renew_connections()``).
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from onceonly._core.admin import PurgeRule, Query, ScopeStats
from onceonly._core.state import Expect, Record, Write, one_step_init
from onceonly.errors import OnceOnlyError

__all__ = [
    "AdminStore",
    "AsyncAdminStore",
    "AsyncListener",
    "AsyncSession",
    "AsyncSetClaims",
    "AsyncStore",
    "Listener",
    "OutboxStatements",
    "ReplayCache",
    "Session",
    "SetClaims",
    "Snapshot",
    "Statement",
    "Store",
    "TxHealth",
]

Params = Sequence[Any] | None
#: One statement of a store's own SQL and its parameters (``?`` placeholders; ``None``:
#: none, the text is sent as written).
Statement = tuple[str, Params]


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


class OutboxStatements(Protocol):
    """The statements of one outbox table in its store's SQL (``?`` placeholders), as
    ``store.outbox_statements(table)`` gives them; :mod:`onceonly.outbox` runs them
    through the store's sessions (no I/O here).

    Rows: ``seq`` (insert order), ``id`` (the message id), ``topic``, ``key``,
    ``payload``, ``headers``, ``state`` (``pending``/``dead``), ``attempts``,
    ``available_at``, ``last_error``, ``created_at``. A claim reads
    ``seq, id, topic, key, payload, headers, attempts, created_at``.

    .. versionadded:: 0.5
    """

    @property
    def table(self) -> str:
        """The outbox table (a validated identifier)."""

    @property
    def channel(self) -> str | None:
        """The channel an insert notifies (LISTEN/NOTIFY), or ``None``: relays poll."""

    @property
    def leases(self) -> bool:
        """``True``: a relay leases its batch (``lock_token``/``locked_until``) in a short
        transaction and publishes outside it; ``False``: it holds the batch's rows locked
        (``FOR UPDATE SKIP LOCKED``) in one transaction while it publishes."""

    @property
    def transactional_ddl(self) -> bool:
        """Whether the DDL runs inside a transaction (``False``: each statement commits
        on its own, as on MariaDB/MySQL)."""

    def migrate(self) -> list[str]:
        """The DDL creating the table (what ``store.migrate()`` runs); repeatable."""

    def drop(self) -> list[str]:
        """Undo :meth:`migrate`."""

    def migration(self) -> list[Statement]:
        """Everything ``Outbox.migrate()`` runs: a lock serialising migrators where the
        store has one, :meth:`migrate`, and the table's row in ``onceonly_schema``."""

    def insert(self, values: tuple[Any, ...], lock_key: str | None) -> list[Statement]:
        """Insert a row: ``values`` are ``(id, topic, key, payload, headers)``; with
        ``lock_key`` (ordered mode), the key's inserts are serialised first, so a key's
        ``seq`` order is its commit order."""

    def claim(self, *, ordered: bool) -> str:
        """Claim a batch of pending rows due now, oldest first (ordered: only the oldest
        pending row of each key). Parameters: ``(limit)``, or when :attr:`leases`,
        ``(lease seconds, token, limit)``."""

    def delete(self, seqs: list[int], token: int | None) -> list[Statement]:
        """Delete published rows (``token``: the lease's, when :attr:`leases`)."""

    def fail(self) -> str:
        """A refused publish: one more attempt, ``dead`` at ``max_attempts``, retried after
        a delay. Parameters: ``(error, delay seconds, max_attempts, seq[, token])``."""

    def postpone(self) -> str:
        """A publish that failed because the broker was unreachable: no attempt counted,
        retried after a delay. Parameters: ``(error, delay seconds, seq[, token])``."""

    def list_rows(self) -> str:
        """Rows in a state, oldest first: the claim's columns and ``last_error``.
        Parameters: ``(state, limit)``."""

    def redrive(self, *, all_dead: bool) -> str:
        """Dead rows back to pending with zero attempts. Parameters: ``(id)``, or none
        with ``all_dead``."""

    def counts(self) -> str:
        """``(state, count)`` rows."""


class Listener(Protocol):
    """A connection waiting for the notifications of an outbox channel (sync).

    .. versionadded:: 0.5
    """

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a notification; whether one came.

        Raises:
            StoreUnavailable: the connection was lost.
        """

    def close(self) -> None:
        """Close the connection (it may be broken already)."""


class AsyncListener(Protocol):
    """The methods of :class:`Listener`, awaited.

    .. versionadded:: 0.5
    """

    async def wait(self, seconds: float) -> bool: ...

    async def close(self) -> None: ...


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


class ReplayCache(Protocol):
    """Completed records kept in this process (no I/O), asked before a claim's session.

    A store with one names it as :attr:`Store.replay_cache`; a leased claim that it
    answers opens no session and builds no claim (``@idempotent``, the leased inbox,
    the HTTP flow). It answers only where the claim's decision would be a replay of the
    record (:func:`onceonly._core.state.replays`); anything else is a miss.

    .. versionadded:: 0.5
    """

    def replay(self, scope: str, key: str, fingerprint: str | None) -> tuple[Record, float] | None:
        """The completed record a claim of ``(scope, key)`` with ``fingerprint`` replays,
        and the store's now (estimated) at the decision; ``None``: ask the store."""


class Store(Protocol):
    """A sync store of records."""

    url: str
    atomic: bool  # whether transaction() can hold the caller's SQL writes
    #: Whose SQL the store speaks: ``"sqlite"``, ``"postgresql"``, ``"mysql"``, or
    #: ``"memory"``/``"redis"`` (none).
    dialect: str
    #: The outbox table :meth:`migrate` creates (``None``: none).
    outbox_table: str | None
    #: The schema version :meth:`migrate` writes (``None``: a store without tables).
    latest_schema_version: int | None
    #: Completed records kept in this process, asked before a leased claim opens a
    #: session (``None``: none; a ``TieredStore`` with a local tier has one).
    #:
    #: .. versionadded:: 0.5
    replay_cache: ReplayCache | None

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

    def schema_version(self) -> int | None:
        """The schema version recorded for the records table (``None``: not migrated,
        or a store without tables).

        .. versionadded:: 0.5
        """

    @property
    def pool_size(self) -> int | None:
        """The most connections the store's pool opens at once (``None``: no bound of the
        store's own: it has no pool, or borrows from someone else's).

        .. versionadded:: 0.5
        """

    def admin(self) -> AdminStore:
        """Operator access to the records.

        Raises:
            ConfigurationError: the store offers none (Redis).

        .. versionadded:: 0.5
        """

    def outbox_statements(self, table: str) -> OutboxStatements:
        """The statements of the outbox table ``table`` in this store's SQL.

        Raises:
            ConfigurationError: a store without SQL (memory, Redis), or a bad name.

        .. versionadded:: 0.5
        """

    def translate(self, exc: BaseException) -> OnceOnlyError | None:
        """The library's error for a driver error of a statement run through a session's
        ``execute`` (the outbox's own statements): :class:`~onceonly.NotMigrated` for a
        missing table, :class:`~onceonly.StoreUnavailable` for a failure worth retrying
        (connection lost, server restarting, a failover, a busy file),
        :class:`~onceonly.StoreError` for the rest; ``None`` when ``exc`` is not an error
        of this store's driver.

        .. versionadded:: 0.5
        """

    def listen(self, channel: str) -> Listener | None:
        """A connection of its own waiting for ``channel``'s notifications (an outbox
        relay's wake-ups), or ``None`` where they cannot reach one (no notifications,
        or transaction pooling): poll instead.

        .. versionadded:: 0.5
        """

    def renew_connections(self) -> None:
        """Have the pool replace its idle connections now (after an outage each stale
        one would fail a retry of its own); nothing for a store without a pool.

        .. versionadded:: 0.5
        """

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


@runtime_checkable
class SetClaims(Protocol):
    """A session that claims and updates the keys of a batch set-based, in one statement
    each (PostgreSQL). Other sessions claim one key at a time (the inbox does it for
    them, with the same decisions: docs/spec.md §1.6a).

    .. versionadded:: 0.6
    """

    def claim_many(self, scope: str, claims: Sequence[tuple[str, Write]]) -> list[Snapshot]:
        """``claim`` of every ``(key, write)`` (distinct keys), rows written or locked in
        key order; one snapshot per claim, in the order given."""

    def update_many(
        self, scope: str, writes: Sequence[tuple[str, Expect, Write]]
    ) -> list[Record | None]:
        """``update`` of every ``(key, expect, write)`` (distinct keys), in order."""


@runtime_checkable
class AsyncSetClaims(Protocol):
    """:class:`SetClaims` of an async session."""

    async def claim_many(
        self, scope: str, claims: Sequence[tuple[str, Write]]
    ) -> list[Snapshot]: ...

    async def update_many(
        self, scope: str, writes: Sequence[tuple[str, Expect, Write]]
    ) -> list[Record | None]: ...


class AsyncStore(Protocol):
    """An async store of records; the methods of :class:`Store`, awaited."""

    url: str
    atomic: bool
    dialect: str
    outbox_table: str | None
    latest_schema_version: int | None
    replay_cache: ReplayCache | None

    @property
    def connection_source(self) -> Hashable: ...

    async def migrate(self) -> None: ...

    async def schema_version(self) -> int | None: ...

    @property
    def pool_size(self) -> int | None: ...

    def admin(self) -> AsyncAdminStore: ...

    def outbox_statements(self, table: str) -> OutboxStatements: ...

    def translate(self, exc: BaseException) -> OnceOnlyError | None: ...

    async def listen(self, channel: str) -> AsyncListener | None: ...

    async def renew_connections(self) -> None: ...

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
