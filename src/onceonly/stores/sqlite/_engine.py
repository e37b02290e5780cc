# SPDX-License-Identifier: MIT
"""The SQLite store over a SQLAlchemy engine's pool (``open_store(engine)``).

Each transaction borrows a ``sqlite3`` connection from the engine (``sqlite://`` with
the stdlib driver) and gives it back as it found it: the store runs its own
``BEGIN IMMEDIATE`` (``isolation_level = None`` while it has the connection) and sets
``busy_timeout`` to its ``lock_wait``; both are restored. The journal mode is the
application's (WAL is recommended: readers then never wait for the writer).
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

from onceonly.stores._engine_pool import EngineConnections
from onceonly.stores.sqlite._rows import _in_transaction, _translate
from onceonly.stores.sqlite._store import SQLiteStore

__all__ = ["SQLiteEngineStore"]


class SQLiteEngineStore(SQLiteStore):
    """:class:`~onceonly.stores.sqlite._store.SQLiteStore` on connections borrowed from a
    SQLAlchemy engine.

    .. versionadded:: 0.3
    """

    def __init__(
        self,
        engine: Any,
        *,
        table: str = "onceonly_records",
        outbox_table: str | None = "onceonly_outbox",
    ) -> None:
        super().__init__(
            engine.url.database or "",
            table=table,
            outbox_table=outbox_table,
            url=engine.url.render_as_string(hide_password=True),
        )
        self.engine = engine
        self._engine_connections = EngineConnections(engine)
        # what each borrowed connection had: (isolation_level, busy_timeout), by id
        self._saved: dict[int, tuple[Any, int]] = {}

    def _acquire(self) -> sqlite3.Connection:
        conn: sqlite3.Connection = self._engine_connections.borrow()
        try:
            busy = conn.execute("PRAGMA busy_timeout").fetchone()[0]
            self._saved[id(conn)] = (conn.isolation_level, busy)
            self._busy[id(conn)] = busy
            conn.isolation_level = None  # the store sends BEGIN IMMEDIATE itself
        except BaseException as exc:
            self._engine_connections.give_back(conn, broken=True)
            if isinstance(exc, sqlite3.Error):  # a closed connection: StoreUnavailable
                raise _translate(exc) from exc
            raise
        return conn

    def _release(self, conn: sqlite3.Connection) -> None:
        isolation, busy = self._saved.pop(id(conn))
        # never hand back a connection with a transaction, nor a closed one
        broken = _in_transaction(conn) is not False
        if not broken:
            try:
                if self._busy.pop(id(conn), busy) != busy:
                    conn.execute(f"PRAGMA busy_timeout = {int(busy)}")
                conn.isolation_level = isolation
            except sqlite3.Error:
                broken = True
        self._busy.pop(id(conn), None)
        self._engine_connections.give_back(conn, broken=broken)

    def close(self) -> None:
        """Nothing to close: the engine and its pool stay open."""
        self._closed = True


if TYPE_CHECKING:  # the contract is checked statically
    from onceonly.types import Store

    _contract: type[Store] = SQLiteEngineStore
