# SPDX-License-Identifier: MIT
"""The PostgreSQL store over a ``postgresql+psycopg2`` SQLAlchemy engine.

The engine's connections are psycopg2 ones: each transaction borrows one and runs the
store's statements on it in a savepoint of a transaction of its own, exactly as when a
caller's psycopg2 connection is joined (:mod:`onceonly.stores.postgres._psycopg2`), then
commits and gives it back. An autocommit session (leased mode, the relay) runs them with
autocommit on. ``migrate()`` runs the store's DDL on a borrowed connection too.
Not available on this store: partitioned tables and the admin operations (they use
psycopg 3 connections).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from psycopg import sql

from onceonly.errors import ConfigurationError
from onceonly.stores._engine_pool import EngineConnections
from onceonly.stores.postgres._admin import PostgresAdmin
from onceonly.stores.postgres._psycopg2 import Psycopg2Session, _Errors, joined
from onceonly.stores.postgres._schema import SCHEMA_TABLE
from onceonly.stores.postgres._sql import _lock_timeout
from onceonly.stores.postgres._store import PostgresStore

__all__ = ["Psycopg2EngineStore"]

log = logging.getLogger("onceonly.stores.postgres")


class _Shim:
    """The slice of a psycopg 3 connection the schema code uses, on a psycopg2 one."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, query: Any, params: Any = None) -> Any:
        if isinstance(query, sql.Composable):
            query = query.as_string(None)
        cur = self._conn.cursor()
        cur.execute(query, params)
        return cur


class Psycopg2EngineStore(PostgresStore):
    """:class:`~onceonly.stores.postgres._store.PostgresStore` on psycopg2 connections borrowed
    from a SQLAlchemy engine.

    .. versionadded:: 0.3
    """

    def __init__(
        self,
        engine: Any,
        conninfo: str,
        *,
        table: str = "onceonly_records",
        outbox_table: str | None = "onceonly_outbox",
    ) -> None:
        self._borrowing = EngineConnections(engine, conninfo)
        pool: Any = self._borrowing
        super().__init__(table=table, outbox_table=outbox_table, pool=pool, pipeline=False)
        self.engine = engine

    def admin(self) -> PostgresAdmin:
        """Refused: the admin operations need psycopg 3 connections.

        Raises:
            ConfigurationError: always.
        """
        raise ConfigurationError(
            "a store over a postgresql+psycopg2 engine has no operator access (it needs"
            " psycopg 3 connections); open the store with a postgresql+psycopg engine or a"
            " postgresql:// URL"
        )

    def _connection(self, *, autocommit: bool) -> Any:
        """The psycopg 3 connections of the admin and partition operations: none here."""
        raise ConfigurationError(
            "this operation needs psycopg 3 connections; open the store with a "
            "postgresql+psycopg engine or a postgresql:// URL"
        )

    @contextmanager
    def _borrowed(self, *, autocommit: bool) -> Iterator[Any]:
        conn = self._borrowing.borrow()
        original = conn.autocommit
        broken = False
        try:
            if original != autocommit:
                conn.autocommit = autocommit
            if not self._connected_once:
                self._detect_layout(_Shim(conn))  # type: ignore[arg-type]
                self._connected_once = True
            yield conn
        except BaseException:
            broken = bool(conn.closed)
            if not conn.autocommit:
                try:
                    conn.rollback()
                except Exception:
                    broken = True
            raise
        finally:
            if not broken and not conn.closed and conn.autocommit != original:
                try:
                    conn.autocommit = original
                except Exception:
                    broken = True
            self._borrowing.give_back(conn, broken=broken or bool(conn.closed))

    def transaction(
        self, connection: Any = None, *, lock_wait: float = 5.0
    ) -> AbstractContextManager[Any]:
        """See :meth:`PostgresStore.transaction`; without ``connection`` the transaction
        runs on a borrowed psycopg2 connection."""
        if connection is not None:
            return super().transaction(connection, lock_wait=lock_wait)
        return self._owned(_lock_timeout(lock_wait))

    @contextmanager
    def _owned(self, lock_timeout: str | None) -> Iterator[Psycopg2Session]:
        with self._borrowed(autocommit=False) as conn:
            with joined(self, conn, lock_timeout) as session:
                yield session
            with _Errors():
                conn.commit()

    @contextmanager
    def session(self) -> Iterator[Psycopg2Session]:  # type: ignore[override]
        """An autocommit session on a borrowed psycopg2 connection."""
        with self._borrowed(autocommit=True) as conn:
            yield Psycopg2Session(self, conn, None)

    @property
    def connection_source(self) -> Hashable:
        """The SQLAlchemy engine, whose pool lends the connections.

        See :attr:`onceonly.types.Store.connection_source`.
        """
        engine: Hashable = self.engine
        return engine

    def migrate(
        self, *, partitioned: bool = False, period: timedelta = timedelta(days=1), ahead: int = 3
    ) -> None:
        """Create the tables (see :meth:`PostgresStore.migrate`; not partitioned here)."""
        if partitioned:
            raise ConfigurationError(
                "partitioned tables need psycopg 3: migrate with a postgresql+psycopg "
                "engine or a postgresql:// URL"
            )
        with self._borrowed(autocommit=False) as conn, _Errors():
            self._create_tables(_Shim(conn), False)  # type: ignore[arg-type]
            conn.commit()

    def schema_version(self) -> int | None:
        with self._borrowed(autocommit=True) as conn:
            shim = _Shim(conn)
            with _Errors():
                row = shim.execute("SELECT to_regclass(%s) IS NOT NULL", (SCHEMA_TABLE,))
                if not row.fetchone()[0]:
                    return None
                found = shim.execute(
                    f"SELECT version FROM {SCHEMA_TABLE} WHERE component = %s", (self._component,)
                ).fetchone()
        return None if found is None else int(found[0])


if TYPE_CHECKING:  # the contract is checked statically
    from onceonly.types import Store

    _contract: type[Store] = Psycopg2EngineStore
