# SPDX-License-Identifier: MIT
"""Joining a caller's psycopg2 connection with the (sync) PostgreSQL store.

The store's own connections are psycopg 3; many applications (Django, SQLAlchemy
deployments) still hold psycopg2 ones. ``store.transaction(connection=psycopg2_conn)``
runs the store's statements on that connection, inside a savepoint of its transaction,
and never commits it: the same statements, bounds and fencing as
:mod:`onceonly.stores.postgres._session_async`. A psycopg2 connection with autocommit off
and no transaction yet counts as inside one (psycopg2 sends ``BEGIN`` before the
savepoint, as it would before the caller's next statement).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from onceonly._core.sql import qmark_to_format
from onceonly._core.state import Expect, Record, Write
from onceonly.errors import (
    ConfigurationError,
    StoreUnavailable,
    TransactionAborted,
    TransactionEnded,
)
from onceonly.stores.postgres._errors import translate_psycopg2
from onceonly.stores.postgres._sql import (
    _OPEN_SAVEPOINT,
    _RELEASE_SAVEPOINT,
    _UNDO_SAVEPOINT,
    _claimed,
    _record,
    _Statement,
    _update_values,
    _updated,
    _write_values,
    _written,
)
from onceonly.types import Params, Snapshot, TxHealth

if TYPE_CHECKING:
    from onceonly.stores.postgres._store import PostgresStore

__all__ = ["Psycopg2Session", "is_psycopg2", "joined"]

log = logging.getLogger("onceonly.stores.postgres")

# psycopg2.extensions.TRANSACTION_STATUS_*
_IDLE, _ACTIVE, _INTRANS, _INERROR, _UNKNOWN = 0, 1, 2, 3, 4
_CLAIM_RACE_RETRIES = 5


def is_psycopg2(connection: Any) -> bool:
    """Whether ``connection`` is a psycopg2 connection (psycopg2 is never imported here)."""
    psycopg2 = sys.modules.get("psycopg2")
    return psycopg2 is not None and isinstance(connection, psycopg2.extensions.connection)


class _Errors:
    """Translate psycopg2 errors of the store's own statements (the backend's one table:
    :func:`~onceonly.stores.postgres._errors.translate_psycopg2`)."""

    def __init__(self, scope: str | None = None, key: str | None = None, waiting: bool = False):
        self.scope, self.key, self.waiting = scope, key, waiting

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            return
        error = translate_psycopg2(exc, self.scope, self.key, waiting=self.waiting)
        if error is not None:
            raise error from exc


@functools.lru_cache(maxsize=1024)
def _user_query(text: str) -> str:
    return qmark_to_format(text)


class Psycopg2Session:
    """The store's session on a caller's psycopg2 connection, inside a savepoint.

    .. versionadded:: 0.3
    """

    def __init__(self, store: PostgresStore, conn: Any, lock_timeout: str | None) -> None:
        self._q = store._statements
        self._conn = conn
        self._cur = conn.cursor()
        self._lock_timeout = lock_timeout
        self._held: set[tuple[str, str]] = set()

    @property
    def connection(self) -> Any:
        """The psycopg2 connection; never commit it yourself inside the handler."""
        return self._conn

    def health(self) -> TxHealth:
        conn = self._conn
        if conn.closed:
            return TxHealth.LOST
        status = conn.info.transaction_status
        if status == _INERROR:
            return TxHealth.ABORTED
        if status == _IDLE:
            return TxHealth.ENDED
        if status == _UNKNOWN:
            return TxHealth.LOST
        return TxHealth.OK

    def _run(self, statement: _Statement, params: tuple[Any, ...], scope: str, key: str) -> Any:
        cur = self._cur
        if self._lock_timeout is not None and (scope, key) not in self._held:
            query, params, waiting = statement.bounded, (self._lock_timeout, *params), True
        else:
            query, waiting = statement.plain, False
        with _Errors(scope, key, waiting):
            cur.execute(query, params)
        return cur

    def execute(self, sql: str, params: Params = None) -> Any:
        """Run the caller's SQL (``?`` placeholders) on the connection; returns a cursor."""
        cur = self._conn.cursor()
        if params is None:
            cur.execute(sql)
        else:
            cur.execute(_user_query(sql), tuple(params))
        return cur

    def claim(self, scope: str, key: str, write: Write) -> Snapshot:
        values = _write_values(scope, key, write)
        params = (scope, key, *values) if self._q.partitioned else (*values, scope, key)
        for _ in range(_CLAIM_RACE_RETRIES):
            snap = _claimed(
                scope, key, write, self._run(self._q.claim, params, scope, key).fetchone()
            )
            if snap is not None:
                if snap.inserted:
                    self._held.add((scope, key))
                return snap
            snap = self.get(scope, key)
            if snap.record is not None:
                return snap
        raise StoreUnavailable(
            "the claim kept racing concurrent writers of this key; retry", scope=scope, key=key
        )

    def get(self, scope: str, key: str) -> Snapshot:
        with _Errors(scope, key):
            self._cur.execute(self._q.get, (scope, key))
        row = self._cur.fetchone()
        return Snapshot(None if row[0] is None else _record(row), row[15])

    def update(self, scope: str, key: str, expect: Expect, write: Write) -> Record | None:
        params = _update_values(scope, key, write, expect)
        row = self._run(self._q.update, params, scope, key).fetchone()
        if row is None or row[0] is None:
            return None
        self._held.add((scope, key))
        return _updated(scope, key, write, row)

    def insert(self, scope: str, key: str, write: Write) -> Record | None:
        values = _write_values(scope, key, write)
        params = (scope, key, *values) if self._q.partitioned else values
        row = self._run(self._q.insert, params, scope, key).fetchone()
        if row is None or row[0] is None:
            return None
        self._held.add((scope, key))
        return _written(scope, key, write, row[0], row[0])

    def renew(self, scope: str, key: str, token: int, lease_seconds: float) -> float | None:
        params = (float(lease_seconds), scope, key, token, token)
        row = self._run(self._q.renew, params, scope, key).fetchone()
        return None if row is None else cast("float | None", row[0])

    def save_checkpoint(
        self, scope: str, key: str, token: int, checkpoint: str, lease_seconds: float | None = None
    ) -> bool:
        lease = None if lease_seconds is None else float(lease_seconds)
        row = self._run(
            self._q.checkpoint, (checkpoint, lease, scope, key, token, token), scope, key
        ).fetchone()
        return row is not None and row[0] is not None


@contextmanager
def joined(store: PostgresStore, conn: Any, lock_timeout: str | None) -> Iterator[Psycopg2Session]:
    """A savepoint of ``conn``'s transaction: released on success, rolled back on error."""
    if conn.closed or conn.autocommit:
        raise ConfigurationError(
            "the psycopg2 connection is in autocommit (not inside a transaction); turn "
            "autocommit off: the claim joins its transaction"
        )
    if conn.info.transaction_status == _INERROR:
        raise ConfigurationError("the psycopg2 connection's transaction has failed; roll it back")
    with _Errors():
        conn.cursor().execute(_OPEN_SAVEPOINT)  # psycopg2 sends BEGIN first if none is open
    session = Psycopg2Session(store, conn, lock_timeout)
    try:
        yield session
    except BaseException:
        try:
            if conn.info.transaction_status in (_INTRANS, _INERROR):
                conn.cursor().execute(_UNDO_SAVEPOINT)
        except Exception:
            log.debug("rolling back to the savepoint failed", exc_info=True)
        raise
    health = session.health()
    if health is TxHealth.ABORTED:
        conn.cursor().execute(_UNDO_SAVEPOINT)
        raise TransactionAborted("a statement failed inside the transaction; it was rolled back")
    if health is TxHealth.ENDED:
        raise TransactionEnded("the transaction was committed or rolled back by its user")
    if health is TxHealth.LOST:
        raise StoreUnavailable("the connection was lost before the savepoint was released")
    with _Errors():
        conn.cursor().execute(_RELEASE_SAVEPOINT)
