# SPDX-License-Identifier: MIT
"""``open_store(engine)``: a store over a SQLAlchemy ``Engine``/``AsyncEngine``'s pool.

The store borrows a connection from the engine for each transaction and gives it back,
so the application keeps one pool. The dialects and drivers understood:

=====================  ==================================  ==============================
database               ``Engine`` (``open_store``)         ``AsyncEngine`` (``open_async_store``)
=====================  ==================================  ==============================
PostgreSQL             ``postgresql+psycopg``,             ``postgresql+psycopg``
                       ``postgresql+psycopg2``
SQLite                 ``sqlite`` (the stdlib driver)      —
MariaDB/MySQL          ``mysql+pymysql``, ``mariadb+pymysql``  ``mysql+aiomysql``
=====================  ==================================  ==============================

SQLAlchemy is imported only when a caller passes one of its objects.
"""

from __future__ import annotations

import sys
from typing import Any

from onceonly.errors import UnsupportedEngine
from onceonly.types import AsyncStore, Store

__all__ = ["async_store_over", "is_engine", "store_over"]

_SYNC = {
    ("postgresql", "psycopg"): "postgresql",
    ("postgresql", "psycopg2"): "psycopg2",
    ("sqlite", "pysqlite"): "sqlite",
    ("mysql", "pymysql"): "mysql",
    ("mariadb", "pymysql"): "mysql",
}
_ASYNC = {
    ("postgresql", "psycopg"): "postgresql",
    ("postgresql", "psycopg_async"): "postgresql",
    ("mysql", "aiomysql"): "mysql",
    ("mariadb", "aiomysql"): "mysql",
}
_OPTIONS = {"table", "outbox_table"}


def is_engine(obj: Any) -> bool:
    """Whether ``obj`` is a SQLAlchemy ``Engine`` or ``AsyncEngine``."""
    if "sqlalchemy" not in sys.modules:  # nobody could have built one
        return False
    from sqlalchemy.engine import Engine

    if isinstance(obj, Engine):
        return True
    asyncio_engine = sys.modules.get("sqlalchemy.ext.asyncio")
    return asyncio_engine is not None and isinstance(obj, asyncio_engine.AsyncEngine)


def _kind(engine: Any, table: dict[tuple[str, str], str], flavour: str) -> str:
    dialect = engine.dialect
    kind = table.get((dialect.name, dialect.driver))
    if kind is None:
        supported = ", ".join(sorted(f"{name}+{driver}" for name, driver in table))
        raise UnsupportedEngine(
            f"cannot open a store over a {dialect.name}+{dialect.driver} {flavour}; "
            f"supported: {supported}"
        )
    return kind


def _check(options: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise UnsupportedEngine(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for a "
            f"store over an engine; valid options: {', '.join(sorted(allowed))}"
        )


def _conninfo(engine: Any) -> str:
    """A libpq URL for the relay's LISTEN connection (the engine's address and user)."""
    url = engine.url.set(drivername="postgresql")
    rendered: str = url.render_as_string(hide_password=False)
    return rendered


def store_over(engine: Any, options: dict[str, Any]) -> Store:
    """A sync store on connections borrowed from the ``Engine`` ``engine``."""
    from sqlalchemy.engine import Engine

    if not isinstance(engine, Engine):
        raise UnsupportedEngine(
            f"open_store takes a SQLAlchemy Engine, not {type(engine).__name__} "
            "(an AsyncEngine goes to open_async_store)"
        )
    kind = _kind(engine, _SYNC, "Engine")
    if kind == "postgresql":
        _check(options, _OPTIONS | {"pipeline", "prepare"})
        from onceonly.stores._engine_pool import EngineConnections
        from onceonly.stores.postgres import PostgresStore

        pool: Any = EngineConnections(engine, _conninfo(engine))
        return PostgresStore(pool=pool, **options)
    _check(options, _OPTIONS)
    if kind == "psycopg2":
        from onceonly.stores.postgres import Psycopg2EngineStore

        return Psycopg2EngineStore(engine, _conninfo(engine), **options)
    if kind == "sqlite":
        from onceonly.stores.sqlite import SQLiteEngineStore

        if engine.url.database in (None, "", ":memory:"):
            raise UnsupportedEngine(
                "an in-memory SQLite engine: each connection has a database of its own; "
                "use a file (sqlite:///path.db)"
            )
        return SQLiteEngineStore(engine, **options)
    from onceonly.stores.mysql import MySQLEngineStore

    return MySQLEngineStore(engine, **options)


def async_store_over(engine: Any, options: dict[str, Any]) -> AsyncStore:
    """An async store on connections borrowed from the ``AsyncEngine`` ``engine``."""
    asyncio_engine = sys.modules.get("sqlalchemy.ext.asyncio")
    if asyncio_engine is None or not isinstance(engine, asyncio_engine.AsyncEngine):
        raise UnsupportedEngine(
            f"open_async_store takes a SQLAlchemy AsyncEngine, not {type(engine).__name__} "
            "(an Engine goes to open_store)"
        )
    kind = _kind(engine, _ASYNC, "AsyncEngine")
    if kind == "postgresql":
        _check(options, _OPTIONS | {"pipeline", "prepare"})
        from onceonly.stores._engine_pool_async import AsyncEngineConnections
        from onceonly.stores.postgres import AsyncPostgresStore

        pool: Any = AsyncEngineConnections(engine, _conninfo(engine))
        return AsyncPostgresStore(pool=pool, **options)
    _check(options, _OPTIONS)
    from onceonly.stores.mysql import AsyncMySQLEngineStore

    return AsyncMySQLEngineStore(engine, **options)
