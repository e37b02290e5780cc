# SPDX-License-Identifier: MIT
"""The embedded default store: stdlib ``sqlite3`` (``sqlite:///path.db``).

Invariants:

* WAL journal, so readers never block the writer; ``synchronous=NORMAL`` by default
  (durable across process crashes; ``?synchronous=FULL`` for power loss too).
* A transaction is ``BEGIN IMMEDIATE``: it takes the database's write lock first, so
  the claim, the handler's writes and the completion are serialised with every other
  writer, including other processes. A writer that cannot get the lock within
  ``lock_wait`` raises :class:`~onceonly.InFlight` (retry the delivery later).
* The clock is the machine's (``time.time()``): every process sharing the file shares it.
* Connections are pooled per process; a forked child never reuses its parent's.
* While a transaction of the store is open, ``COMMIT``, ``ROLLBACK`` and ``BEGIN`` are
  refused on its connection (an authorizer, consulted only when a statement is
  prepared): a handler's ``tx.connection.commit()``/``rollback()`` raises
  ``sqlite3.DatabaseError`` ("not authorized") instead of ending the transaction that
  holds its claim (docs/spec.md §1.3).
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from types import TracebackType
from typing import TYPE_CHECKING, Any

from onceonly._core.sql import validate_identifier
from onceonly._core.state import Expect, Record, Write
from onceonly.errors import (
    ConfigurationError,
    OnceOnlyError,
    StoreUnavailable,
    TransactionEnded,
)
from onceonly.stores._outbox_sql import SCHEMA_VERSION as OUTBOX_SCHEMA_VERSION
from onceonly.stores._schema import bind_literals, drop_version_rows, version_rows
from onceonly.stores.sqlite._outbox_sql import SQLiteOutboxSQL
from onceonly.stores.sqlite._rows import (
    _COLUMNS,
    _busy_timeout_ms,
    _errors,
    _in_transaction,
    _insert_values,
    _record,
    _translate,
    _update_values,
    _written,
)
from onceonly.types import Listener, Params, ReplayCache, Snapshot, TxHealth

if TYPE_CHECKING:
    from onceonly.stores.sqlite._admin import SQLiteAdmin

__all__ = ["SQLiteStore", "drop_statements", "schema_statements"]

SCHEMA_VERSION = 1
SCHEMA_UPSERT = (
    "INSERT INTO onceonly_schema (component, version) VALUES (?, ?)"
    " ON CONFLICT (component) DO UPDATE SET version = excluded.version"
    " WHERE excluded.version > onceonly_schema.version"
)


def schema_ddl(table: str, outbox_table: str | None) -> list[str]:
    """The schema-version, records and outbox tables (what :meth:`SQLiteStore.migrate`
    runs before recording the versions with ``SCHEMA_UPSERT``)."""
    t = validate_identifier(table)
    ddl = [
        "CREATE TABLE IF NOT EXISTS onceonly_schema"
        " (component TEXT PRIMARY KEY, version INTEGER NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS {t} ("
        " scope TEXT NOT NULL, key TEXT NOT NULL,"
        " state TEXT NOT NULL, fingerprint TEXT, token INTEGER NOT NULL,"
        " attempts INTEGER NOT NULL DEFAULT 0, lease_until REAL, result TEXT,"
        " error TEXT, payload TEXT, checkpoint TEXT, created_at REAL NOT NULL,"
        " updated_at REAL NOT NULL, completed_at REAL, expires_at REAL,"
        " PRIMARY KEY (scope, key)) WITHOUT ROWID",
        f"CREATE INDEX IF NOT EXISTS {t}_state_expiry ON {t} (state, expires_at)",
    ]
    if outbox_table is not None:
        ddl += SQLiteOutboxSQL(outbox_table).migrate()
    return ddl


def schema_statements(
    table: str = "onceonly_records", outbox_table: str | None = "onceonly_outbox"
) -> list[str]:
    """The SQL of :meth:`SQLiteStore.migrate` as plain statements, the version rows
    included (for a migration tool).

    .. versionadded:: 0.5
    """
    rows = version_rows(validate_identifier(table), outbox_table, SCHEMA_VERSION)
    return schema_ddl(table, outbox_table) + [bind_literals(SCHEMA_UPSERT, "?", *r) for r in rows]


def drop_statements(
    table: str = "onceonly_records", outbox_table: str | None = "onceonly_outbox"
) -> list[str]:
    """Undo :func:`schema_statements` (``onceonly_schema`` stays: other tables' rows may be
    in it).

    .. versionadded:: 0.5
    """
    drops = [f'DROP TABLE IF EXISTS "{validate_identifier(table)}"']
    if outbox_table is not None:
        drops += SQLiteOutboxSQL(outbox_table).drop()
    return [*drops, drop_version_rows(version_rows(table, outbox_table, SCHEMA_VERSION))]


# This process's id, kept current across forks without a getpid() per transaction.
_pid = [os.getpid()]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))


class _Fence:
    """The authorizer of a connection: while ``armed``, refuses statements that begin,
    commit or roll back a transaction (savepoints stay allowed)."""

    __slots__ = ("armed",)

    def __init__(self) -> None:
        self.armed = False

    def __call__(
        self, action: int, arg1: str | None, arg2: str | None, db: str | None, src: str | None
    ) -> int:
        if self.armed and action == sqlite3.SQLITE_TRANSACTION:
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK


def _deny_transaction(
    action: int, arg1: str | None, arg2: str | None, db: str | None, src: str | None
) -> int:
    """An armed :class:`_Fence` for a caller's connection, set only inside our savepoint."""
    return sqlite3.SQLITE_DENY if action == sqlite3.SQLITE_TRANSACTION else sqlite3.SQLITE_OK


class SQLiteSession:
    """One SQLite connection, inside a transaction or in autocommit.

    In a transaction of the store's own (``BEGIN IMMEDIATE``: this connection holds the
    database's write lock, so no other writer can add the key before it commits), a
    claim of an absent key is a read: the claim's row is written once, by the statement
    that stores its completion (the claim's insert carrying the completion's values),
    instead of an insert and then an update of the same row. Until then it is
    *pending*: any other use of the record through this session writes it first, and
    a commit of the session with the claim still pending writes it as claimed. Nobody
    outside the transaction can tell the difference: they see neither before it
    commits. The statements a handler runs (``execute``) do not see a pending claim.
    """

    __slots__ = ("_conn", "_deferred", "_pending", "_store", "_transactional")

    def __init__(
        self,
        store: SQLiteStore,
        conn: sqlite3.Connection,
        *,
        transactional: bool = False,
        deferred: bool = False,
    ) -> None:
        self._store = store
        self._conn = conn
        self._transactional = transactional
        # whether a claim may stay pending (the store's own BEGIN IMMEDIATE), and the
        # pending one: (scope, key, write, its time)
        self._deferred = deferred
        self._pending: tuple[str, str, Write, float] | None = None

    @property
    def connection(self) -> sqlite3.Connection:
        return self._conn

    def execute(self, sql: str, params: Params = None) -> sqlite3.Cursor:
        return self._conn.execute(sql, tuple(params) if params is not None else ())

    def health(self) -> TxHealth:
        """ENDED when the transaction this session began (or joined) is over; LOST when
        its connection was closed (by a handler: it took the transaction with it)."""
        in_transaction = _in_transaction(self._conn)
        if in_transaction is None:
            return TxHealth.LOST
        if self._transactional and not in_transaction:
            return TxHealth.ENDED
        return TxHealth.OK

    def _in_transaction(self) -> bool:
        """Whether the connection is inside a transaction (a closed one raises
        :class:`~onceonly.StoreUnavailable`)."""
        with _errors():
            return self._conn.in_transaction

    def claim(self, scope: str, key: str, write: Write) -> Snapshot:
        if self._deferred and self._pending is None:
            try:
                row = self._conn.execute(self._store._get, (scope, key)).fetchone()
            except sqlite3.Error as exc:
                raise _translate(exc) from exc
            now = self._store.clock()
            if row is not None:
                return Snapshot(_record(row), now)
            self._pending = (scope, key, write, now)
            return Snapshot(_written(scope, key, write, now), now, True)
        while True:
            record = self.insert(scope, key, write)
            if record is not None:
                return Snapshot(record, record.updated_at, inserted=True)
            snap = self.get(scope, key)
            if snap.record is not None:
                return snap
            # purged between the two statements (autocommit only): insert again

    def flush(self) -> None:
        """Write the pending claim, if any, as it was claimed (see the class docstring).

        A transaction that ended meanwhile took the claim with it: it is dropped.
        """
        pending, self._pending = self._pending, None
        if pending is None or not self._in_transaction():
            return
        scope, key, write, now = pending
        try:
            self._conn.execute(self._store._insert, _insert_values(scope, key, write, now))
        except sqlite3.Error as exc:
            raise _translate(exc) from exc

    def get(self, scope: str, key: str) -> Snapshot:
        if self._pending is not None:
            self.flush()
        try:
            row = self._conn.execute(self._store._get, (scope, key)).fetchone()
        except sqlite3.Error as exc:
            raise _translate(exc) from exc
        return Snapshot(_record(row) if row else None, self._store.clock())

    def insert(self, scope: str, key: str, write: Write) -> Record | None:
        if self._pending is not None:
            self.flush()
        now = self._store.clock()
        try:
            inserted = self._conn.execute(
                self._store._insert, _insert_values(scope, key, write, now)
            ).rowcount
        except sqlite3.Error as exc:
            raise _translate(exc) from exc
        return _written(scope, key, write, now) if inserted == 1 else None

    def _complete_pending(
        self, pending: tuple[str, str, Write, float], write: Write
    ) -> Record | None:
        """``update`` of the pending claim: one insert of the claim carrying ``write``."""
        self._pending = None
        if not self._in_transaction():
            return None  # the transaction ended, and the claim with it: not ours any more
        scope, key, claimed, created = pending
        if write.keep_checkpoint and write.checkpoint != claimed.checkpoint:
            write = dataclasses.replace(write, checkpoint=claimed.checkpoint)
        now = self._store.clock()
        try:
            inserted = self._conn.execute(
                self._store._insert, _insert_values(scope, key, write, now, created)
            ).rowcount
        except sqlite3.Error as exc:
            raise _translate(exc) from exc
        return _written(scope, key, write, now, created) if inserted == 1 else None

    def update(self, scope: str, key: str, expect: Expect, write: Write) -> Record | None:
        pending = self._pending
        if pending is not None:
            claimed = pending[2]
            if (
                pending[1] == key
                and pending[0] == scope
                and expect.token == claimed.token
                and expect.state is claimed.state
                and not expect.lapsed  # (a time condition: the UPDATE below checks it)
            ):
                return self._complete_pending(pending, write)
            self.flush()
        now = self._store.clock()
        try:
            row = self._conn.execute(
                self._store._q["update"],
                (
                    *_update_values(write, now),
                    scope,
                    key,
                    expect.token,
                    expect.state.value,
                    expect.lapsed,
                    now,
                    now,
                ),
            ).fetchone()
        except sqlite3.Error as exc:
            raise _translate(exc) from exc
        return _record(row) if row else None

    @contextmanager
    def _write_lock(self) -> Iterator[None]:
        """Hold the database's write lock around a holder's lease write.

        A lease runs from when its write happens: in autocommit the statement would wait
        for the lock (busy timeout) after the clock was read, and a renewal queued behind
        a long transaction would be born already spent. In a transaction the lock is
        held already.
        """
        if self._in_transaction():
            yield
            return
        with _errors(begin=True):
            self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._conn.rollback()
            raise
        with _errors():
            self._conn.commit()

    def renew(self, scope: str, key: str, token: int, lease_seconds: float) -> float | None:
        if self._pending is not None:
            self.flush()
        with self._write_lock():
            now = self._store.clock()
            with _errors():
                row = self._conn.execute(
                    self._store._q["renew"], (now + lease_seconds, now, scope, key, token)
                ).fetchone()
        return float(row[0]) if row else None

    def save_checkpoint(
        self, scope: str, key: str, token: int, checkpoint: str, lease_seconds: float | None = None
    ) -> bool:
        if self._pending is not None:
            self.flush()
        with self._write_lock():
            now = self._store.clock()
            until = None if lease_seconds is None else now + lease_seconds
            with _errors():
                row = self._conn.execute(
                    self._store._q["checkpoint"], (checkpoint, until, now, scope, key, token)
                ).fetchone()
        return row is not None


class _Transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` on a pooled connection (``SQLiteStore.transaction``).

    A class rather than a generator context manager: it is entered once per message.
    """

    __slots__ = ("_busy", "_conn", "_fence", "_session", "_store")

    def __init__(self, store: SQLiteStore, busy: int) -> None:
        self._store = store
        self._busy = busy

    def __enter__(self) -> SQLiteSession:
        store = self._store
        conn = store._acquire()
        try:
            if store._busy.get(id(conn)) != self._busy:  # a statement less per transaction
                conn.execute(f"PRAGMA busy_timeout = {self._busy}")
                store._busy[id(conn)] = self._busy
            conn.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            store._release(conn)
            if isinstance(exc, sqlite3.Error):
                raise _translate(exc, begin=True) from exc
            raise
        self._conn = conn
        fence = store._fences.get(id(conn))
        if fence is None:  # a connection borrowed from an engine's pool: fence it too
            fence = store._fences[id(conn)] = _Fence()
            conn.set_authorizer(fence)
        fence.armed = True
        self._fence = fence
        self._session = session = SQLiteSession(store, conn, transactional=True, deferred=True)
        return session

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        conn = self._conn
        self._fence.armed = False
        try:
            in_transaction = _in_transaction(conn)
            if exc_type is not None:
                if in_transaction:
                    conn.rollback()
                return  # the exception propagates
            if in_transaction is None:
                # closed inside the session (by a handler): its transaction went with it
                raise StoreUnavailable("the SQLite connection was closed inside the session")
            if not in_transaction:
                # COMMIT now would report writes that are not ours to report
                raise TransactionEnded("the transaction was ended inside the session")
            try:
                if self._session._pending is not None:
                    self._session.flush()
                conn.commit()
            except sqlite3.Error as error:
                raise _translate(error) from error
        finally:
            self._store._release(conn)


class SQLiteStore:
    """Records in a SQLite database file, shared by the processes of one machine.

    Args:
        path: the database file.
        table: the records table name (validated identifier).
        timeout: seconds to wait for the write lock outside claims.
        synchronous: ``NORMAL`` (default) or ``FULL``.
        clock: the store's clock (default ``time.time``, shared by all processes of the
            machine); tests may inject one.
        outbox_table: the outbox table ``migrate()`` creates (``None``: none).

    .. versionadded:: 0.1
    """

    atomic = True
    dialect = "sqlite"
    latest_schema_version: int | None = SCHEMA_VERSION
    replay_cache: ReplayCache | None = None  # no records kept in the process

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SQLiteStore:
        """A store from ``sqlite:///relative.db`` or ``sqlite:////absolute.db``.

        Query options: ``table``, ``outbox_table``, ``timeout`` (seconds),
        ``synchronous``, ``mode`` (``rwc``: create a missing file, the default; ``rw``:
        refuse it). Keyword options are passed to the constructor.

        Raises:
            ConfigurationError: a malformed URL, an unknown option, or ``mode=rw`` and no
                file at the path.
        """
        from onceonly.stores.sqlite._url import from_url

        return from_url(url, **options)

    def __init__(
        self,
        path: str,
        *,
        table: str = "onceonly_records",
        timeout: float = 5.0,
        synchronous: str = "NORMAL",
        url: str | None = None,
        clock: Callable[[], float] | None = None,
        outbox_table: str | None = "onceonly_outbox",
    ) -> None:
        if path in ("", ":memory:"):
            raise ConfigurationError(
                "an in-memory SQLite database is private to one connection; use memory:// "
                "or a file path"
            )
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ConfigurationError(f"invalid synchronous setting {synchronous!r}")
        self.path = path
        self.clock: Callable[[], float] = clock or time.time
        self.url = url or f"sqlite:///{path}"
        self.table = validate_identifier(table)
        self.outbox_table = validate_identifier(outbox_table) if outbox_table is not None else None
        self.timeout = timeout
        self.synchronous = synchronous.upper()
        self._pool: list[sqlite3.Connection] = []
        # The busy timeout each pooled connection has (by id): set only when it changes.
        self._busy: dict[int, int] = {}
        # The authorizer of each pooled connection (by id), armed inside a transaction.
        self._fences: dict[int, _Fence] = {}
        # the last lock_wait asked for, and its busy timeout in milliseconds
        self._busy_for: tuple[float, int] = (5.0, _busy_timeout_ms(5.0))
        self._pool_pid = _pid[0]
        self._closed = False  # connections given back after close() are closed, not kept
        self._lock = threading.Lock()
        t = self.table
        cols = _COLUMNS
        self._q = {
            "get": f"SELECT {cols} FROM {t} WHERE scope = ? AND key = ?",
            # no RETURNING: an inserted row holds exactly the values bound (_written)
            "insert": (
                f"INSERT INTO {t} (scope, key, created_at, state, fingerprint, token, attempts,"
                " lease_until, result, error, payload, checkpoint, updated_at, completed_at,"
                " expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (scope, key) DO NOTHING"
            ),
            "update": (
                f"UPDATE {t} SET state = ?, fingerprint = ?, token = ?, attempts = ?,"
                " lease_until = ?, result = ?, error = ?, payload = ?,"
                " checkpoint = CASE WHEN ? THEN checkpoint ELSE ? END,"
                " updated_at = ?, completed_at = ?, expires_at = ?"
                " WHERE scope = ? AND key = ? AND token = ? AND state = ? AND (? = 0 OR CASE"
                " WHEN state = 'completed' THEN expires_at <= ? ELSE coalesce(lease_until <= ?, 1)"
                f" END) RETURNING {cols}"
            ),
            "renew": (
                f"UPDATE {t} SET lease_until = ?, updated_at = ? WHERE scope = ? AND key = ?"
                " AND token = ? AND state = 'in_progress' RETURNING lease_until"
            ),
            "checkpoint": (
                f"UPDATE {t} SET checkpoint = ?, lease_until = coalesce(?, lease_until),"
                " updated_at = ? WHERE scope = ? AND key = ?"
                " AND token = ? AND state = 'in_progress' RETURNING token"
            ),
        }

        self._get, self._insert = self._q["get"], self._q["insert"]

    # -- connections
    def _connect(self) -> sqlite3.Connection:
        with _errors():
            conn = sqlite3.connect(
                self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            fence = self._fences[id(conn)] = _Fence()
            conn.set_authorizer(fence)
        self._busy.pop(id(conn), None)  # a new connection (its id may be a dead one's)
        return conn

    def _acquire(self) -> sqlite3.Connection:
        with self._lock:
            if self._pool_pid != _pid[0]:  # forked: the parent's connections are not ours
                self._pool = []
                self._pool_pid = _pid[0]
            while self._pool:
                conn = self._pool.pop()
                if _in_transaction(conn) is not None:
                    return conn
                self._forget(conn)  # closed after it was given back (a kept tx.connection)
        return self._connect()

    def _release(self, conn: sqlite3.Connection) -> None:
        # never hand out a connection with an open transaction, nor a closed one
        if _in_transaction(conn) is False:
            with self._lock:
                if not self._closed and self._pool_pid == _pid[0] and len(self._pool) < 16:
                    self._pool.append(conn)
                    return
        self._forget(conn)
        conn.close()  # (closing a closed connection does nothing)

    def _forget(self, conn: sqlite3.Connection) -> None:
        """Drop what is kept of ``conn`` by id (its id may be reused by a new one)."""
        self._busy.pop(id(conn), None)
        self._fences.pop(id(conn), None)

    # -- the contract
    @property
    def connection_source(self) -> Hashable:
        """The database file, resolved: its single writer is shared by every store on it.

        See :attr:`onceonly.types.Store.connection_source`.
        """
        return ("sqlite", os.path.realpath(self.path))

    def migrate(self) -> None:
        """Create the records table and record the schema version; safe to repeat."""
        with self.transaction() as s:
            c = s.connection
            for statement in schema_ddl(self.table, self.outbox_table):
                c.execute(statement)
            if self.outbox_table is not None:
                c.execute(SCHEMA_UPSERT, (f"outbox:{self.outbox_table}", OUTBOX_SCHEMA_VERSION))
            c.execute(SCHEMA_UPSERT, (f"records:{self.table}", SCHEMA_VERSION))

    def schema_version(self) -> int | None:
        """The recorded schema version of this store's table, or None before migrate()."""
        with self.session() as s:
            try:
                row = s.connection.execute(
                    "SELECT version FROM onceonly_schema WHERE component = ?",
                    (f"records:{self.table}",),
                ).fetchone()
            except sqlite3.OperationalError:
                return None
        return int(row[0]) if row else None

    def transaction(
        self, connection: Any = None, *, lock_wait: float = 5.0
    ) -> AbstractContextManager[SQLiteSession]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` on a pooled connection, or a savepoint in
        the caller's ``sqlite3.Connection`` (which must be inside a transaction)."""
        if connection is not None:
            return contextmanager(self._savepoint)(connection)
        if lock_wait != self._busy_for[0]:  # the same wait every time, in practice
            self._busy_for = (lock_wait, _busy_timeout_ms(lock_wait))
        return _Transaction(self, self._busy_for[1])

    def _savepoint(self, conn: Any) -> Iterator[SQLiteSession]:
        if not isinstance(conn, sqlite3.Connection):
            raise ConfigurationError(
                f"the SQLite store joins a sqlite3.Connection, not {type(conn).__name__}"
            )
        if not conn.in_transaction:
            raise ConfigurationError(
                "the connection passed in is not inside a transaction; begin one first "
                "(the claim must commit with your writes, never on its own)"
            )
        name = f"onceonly_{threading.get_ident()}_{time.monotonic_ns()}"
        conn.execute(f"SAVEPOINT {name}")
        session = SQLiteSession(self, conn, transactional=True)
        # The caller's connection refuses COMMIT/ROLLBACK while our savepoint is open
        # (replacing, then clearing, any authorizer of the caller's: sqlite3 has no
        # getter; our own pooled connections keep theirs, see _Fence).
        own = self._fences.get(id(conn))  # a connection of an engine we borrow from
        was_armed = own is not None and own.armed
        if own is not None:
            own.armed = True
        else:
            conn.set_authorizer(_deny_transaction)
        try:
            try:
                yield session
            finally:
                if own is not None:
                    own.armed = was_armed
                else:
                    with suppress(sqlite3.ProgrammingError):  # closed inside the session
                        conn.set_authorizer(None)
        except BaseException:
            if _in_transaction(conn):
                with suppress(sqlite3.OperationalError):  # gone with the ended transaction
                    conn.execute(f"ROLLBACK TO SAVEPOINT {name}")
                    conn.execute(f"RELEASE SAVEPOINT {name}")
            raise
        health = session.health()
        if health is TxHealth.LOST:
            raise StoreUnavailable("the caller's SQLite connection was closed inside the session")
        if health is not TxHealth.OK:
            raise TransactionEnded("the caller's transaction was ended inside the session")
        try:
            conn.execute(f"RELEASE SAVEPOINT {name}")
        except sqlite3.OperationalError as exc:
            if "no such savepoint" not in str(exc):
                raise _translate(exc) from exc
            # the caller's transaction was ended (COMMIT/ROLLBACK) and a new one begun
            raise TransactionEnded("the caller's transaction was ended inside the session") from exc

    @contextmanager
    def session(self) -> Iterator[SQLiteSession]:
        """An autocommit session: each statement is its own transaction."""
        conn = self._acquire()
        try:
            yield SQLiteSession(self, conn)
        finally:
            self._release(conn)

    def admin(self) -> SQLiteAdmin:
        """Operator access to the records (:class:`~onceonly.types.AdminStore`).

        .. versionadded:: 0.2
        """
        from onceonly.stores.sqlite._admin import SQLiteAdmin

        return SQLiteAdmin(self)

    @property
    def pool_size(self) -> int | None:
        """``None``: connections are opened as needed (the file has one writer anyway)."""
        return None

    # -- the outbox's side

    def outbox_statements(self, table: str) -> SQLiteOutboxSQL:
        """The statements of the outbox table ``table`` (:mod:`._outbox_sql`)."""
        return SQLiteOutboxSQL(validate_identifier(table))

    def translate(self, exc: BaseException) -> OnceOnlyError | None:
        """The onceonly error for a ``sqlite3`` error of a statement run through a session
        (the store's one table: :func:`~onceonly.stores.sqlite._rows._translate`)."""
        return _translate(exc) if isinstance(exc, sqlite3.Error) else None

    def listen(self, channel: str) -> Listener | None:
        """``None``: SQLite sends no notifications (relays poll)."""
        return None

    def renew_connections(self) -> None:
        """Nothing: a connection to a file does not go stale."""

    def close(self) -> None:
        """Close the pooled connections of this process.

        A connection still in use (a transaction finishing on another thread) is closed
        when it is given back. The store stays usable, without pooling.
        """
        with self._lock:
            pool, self._pool = self._pool, []
            self._closed = True
        for conn in pool:
            conn.close()


if TYPE_CHECKING:  # the contract is checked statically
    from onceonly.types import OutboxStatements, Store

    _contract: type[Store] = SQLiteStore
    _outbox: type[OutboxStatements] = SQLiteOutboxSQL
