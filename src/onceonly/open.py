# SPDX-License-Identifier: MIT
"""``open_store(url)`` and ``open_async_store(url)``: stores from SQLAlchemy-style URLs.

``sqlite:///relative.db``, ``sqlite:////absolute/path.db``,
``postgresql://user@host:5432/db`` (extra ``onceonly[postgres]``), ``memory://``.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from onceonly.errors import ConfigurationError
from onceonly.types import AsyncStore, Store

__all__ = ["open_async_store", "open_store"]

_POSTGRES = ("postgresql", "postgres", "postgresql+psycopg")


def _scheme(url: str) -> str:
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            f"not a store URL: {url!r} (expected e.g. sqlite:///onceonly.db, "
            "postgresql://user@host/db, memory://)"
        )
    return urllib.parse.urlsplit(url).scheme.lower()


def _postgres_module(name: str) -> Any:
    try:
        import importlib

        return importlib.import_module(f"onceonly.stores.{name}")
    except ImportError as exc:
        if "psycopg" in str(exc):
            raise ConfigurationError(
                "PostgreSQL needs the postgres extra: pip install 'onceonly[postgres]'"
            ) from exc
        raise


def open_store(url: str, **options: Any) -> Store:
    """Open a sync store.

    Args:
        url: the store URL (see the module docstring).
        **options: passed to the store class (``table=``, pool sizes, …).

    Raises:
        ConfigurationError: an unknown scheme, a malformed URL, a missing extra.

    .. versionadded:: 0.1
    """
    scheme = _scheme(url)
    if scheme == "sqlite":
        from onceonly.stores._sqlite_url import from_url

        return from_url(url, **options)
    if scheme == "memory":
        from onceonly.stores.memory import MemoryStore

        return MemoryStore(url=url, **options)
    if scheme in _POSTGRES:
        mod = _postgres_module("postgres")
        pg: Store = mod.PostgresStore(_pg_conninfo(url), **options)
        return pg
    raise ConfigurationError(f"unknown store scheme {scheme!r} in {url!r}")


def open_async_store(url: str, **options: Any) -> AsyncStore:
    """Open an async store (PostgreSQL natively; SQLite and memory through a thread).

    .. versionadded:: 0.1
    """
    scheme = _scheme(url)
    if scheme in _POSTGRES:
        mod = _postgres_module("postgres_async")
        pg: AsyncStore = mod.AsyncPostgresStore(_pg_conninfo(url), **options)
        return pg
    from onceonly.stores.threaded import ThreadedAsyncStore

    return ThreadedAsyncStore(open_store(url, **options))


def _pg_conninfo(url: str) -> str:
    scheme = _scheme(url)
    return "postgresql" + url[len(scheme) :] if scheme != "postgresql" else url
