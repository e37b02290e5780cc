# SPDX-License-Identifier: MIT
"""``open_store(url)`` and ``open_async_store(url)``: stores from SQLAlchemy-style URLs.

``sqlite:///relative.db``, ``sqlite:////absolute/path.db``,
``postgresql://user@host:5432/db`` (extra ``onceonly[postgres]``),
``mysql://user@host:3306/db`` or ``mariadb://…`` (extra ``onceonly[mysql]``), ``memory://``,
``redis://host:6379/0``, ``rediss://``, ``redis+cluster://``, ``redis+sentinel://``
(extra ``onceonly[redis]``; leased mode only).

Either also takes a SQLAlchemy ``Engine`` (``AsyncEngine`` for ``open_async_store``)
instead of a URL: the store then borrows its connections from the engine's pool
(PostgreSQL with psycopg, SQLite, MariaDB/MySQL with PyMySQL or aiomysql).
"""

from __future__ import annotations

import inspect
import urllib.parse
from typing import Any

from onceonly.errors import ConfigurationError
from onceonly.stores._engine import async_store_over, is_engine, store_over
from onceonly.types import AsyncStore, Store

__all__ = ["open_async_store", "open_store"]

_POSTGRES = ("postgresql", "postgres", "postgresql+psycopg")
_REDIS = (
    "redis",
    "rediss",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
)
_MYSQL = ("mysql", "mariadb", "mysql+pymysql", "mysql+aiomysql", "mariadb+pymysql")


def _scheme(url: str) -> str:
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            f"not a store URL: {url!r} (expected e.g. sqlite:///onceonly.db, "
            "postgresql://user@host/db, mysql://user@host/db, redis://host:6379/0, memory://)"
        )
    return urllib.parse.urlsplit(url).scheme.lower()


# What each store module needs, and how to get it: (the missing module's name contains
# this, the database's name, the extra).
_EXTRAS = {
    "postgres": ("psycopg", "PostgreSQL", "postgres"),
    "redis": ("redis", "Redis", "redis"),
    "mysql": ("mysql", "MariaDB/MySQL", "mysql"),
}


def _store_module(name: str) -> Any:
    """``onceonly.stores.<name>``; a missing driver names the extra that installs it."""
    import importlib

    try:
        return importlib.import_module(f"onceonly.stores.{name}")
    except ImportError as exc:
        needle, label, extra = _EXTRAS[name]
        if needle in str(exc).lower():
            raise ConfigurationError(
                f"{label} needs the {extra} extra: pip install 'onceonly[{extra}]'"
            ) from exc
        raise


def _check_options(cls: Any, options: dict[str, Any], url: str, *, skip: tuple[str, ...]) -> None:
    """Refuse options the store class does not take, naming the ones it does."""
    params = inspect.signature(cls).parameters
    valid = sorted(
        name
        for name, p in params.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and name not in skip
    )
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ConfigurationError(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for "
            f"{_scheme(url)}:// stores; valid options: {', '.join(valid) or '(none)'}"
        )


def open_store(url: str | Any, *, migrate: bool = False, **options: Any) -> Store:
    """Open a sync store.

    Args:
        url: the store URL (see the module docstring), or a SQLAlchemy ``Engine``: the
            store then takes a connection from the engine's pool for each transaction
            and gives it back (the application keeps one pool); options ``table=``,
            ``outbox_table=`` (and ``pipeline=`` on PostgreSQL).
        migrate: create or upgrade the store's tables before returning it (the same as
            calling ``store.migrate()``; safe to repeat). Handy for scripts; services
            usually migrate once at deploy time.
        **options: passed to the store class (``table=``, pool sizes, …).

    Raises:
        ConfigurationError: an unknown scheme or option, a malformed URL, a missing
            extra.
        UnsupportedEngine: an engine of a dialect or driver no store works on, or an
            ``AsyncEngine``.

    .. versionadded:: 0.1
    .. versionchanged:: 0.2 ``migrate=``; unknown options are refused.
    .. versionchanged:: 0.3 a SQLAlchemy ``Engine`` instead of a URL.
    """
    store = store_over(url, options) if is_engine(url) else _open(url, options)
    if migrate:
        try:
            store.migrate()
        except BaseException:
            store.close()
            raise
    return store


def _open(url: str, options: dict[str, Any]) -> Store:
    scheme = _scheme(url)
    if scheme == "sqlite":
        from onceonly.stores.sqlite import SQLiteStore

        _check_options(SQLiteStore, options, url, skip=("url",))
        return SQLiteStore.from_url(url, **options)
    if scheme == "memory":
        from onceonly.stores.memory import MemoryStore

        _check_options(MemoryStore, options, url, skip=("url",))
        if urllib.parse.urlsplit(url)[1:] != ("", "", "", ""):
            raise ConfigurationError(f"a memory store URL is just memory://, not {url!r}")
        return MemoryStore(url=url, **options)
    if scheme in _POSTGRES:
        mod = _store_module("postgres")
        _check_options(mod.PostgresStore, options, url, skip=("pool",))
        pg: Store = mod.PostgresStore(_pg_conninfo(url), **options)
        return pg
    if scheme in _REDIS:
        mod = _store_module("redis")
        _check_options(mod.RedisStore, options, url, skip=())
        rs: Store = mod.RedisStore(url, **options)
        return rs
    if scheme in _MYSQL:
        mod = _store_module("mysql")
        _check_options(mod.MySQLStore, options, url, skip=())
        my: Store = mod.MySQLStore(url, **options)
        return my
    raise ConfigurationError(f"unknown store scheme {scheme!r} in {url!r}")


def open_async_store(url: str | Any, **options: Any) -> AsyncStore:
    """Open an async store (PostgreSQL and Redis natively; SQLite and memory through a thread).

    ``url`` may be a SQLAlchemy ``AsyncEngine`` instead (``postgresql+psycopg``,
    ``mysql+aiomysql``): the store borrows connections from its pool (see
    :func:`open_store`).

    To migrate on open, await the store's ``migrate()`` (safe to repeat):
    ``store = open_async_store(url); await store.migrate()``.

    Raises:
        ConfigurationError: an unknown scheme or option, a malformed URL, a missing
            extra.
        UnsupportedEngine: an engine of a dialect or driver no store works on, or a
            sync ``Engine``.

    .. versionadded:: 0.1
    .. versionchanged:: 0.3 a SQLAlchemy ``AsyncEngine`` instead of a URL.
    """
    if is_engine(url):
        return async_store_over(url, options)
    scheme = _scheme(url)
    if scheme in _POSTGRES:
        mod = _store_module("postgres")
        _check_options(mod.AsyncPostgresStore, options, url, skip=("pool",))
        pg: AsyncStore = mod.AsyncPostgresStore(_pg_conninfo(url), **options)
        return pg
    if scheme in _REDIS:
        mod = _store_module("redis")
        _check_options(mod.AsyncRedisStore, options, url, skip=())
        rs: AsyncStore = mod.AsyncRedisStore(url, **options)
        return rs
    if scheme in _MYSQL:
        mod = _store_module("mysql")
        _check_options(mod.AsyncMySQLStore, options, url, skip=())
        my: AsyncStore = mod.AsyncMySQLStore(url, **options)
        return my
    from onceonly.stores._threaded import ThreadedAsyncStore

    return ThreadedAsyncStore(_open(url, options))


def _pg_conninfo(url: str) -> str:
    scheme = _scheme(url)
    return "postgresql" + url[len(scheme) :] if scheme != "postgresql" else url
