# SPDX-License-Identifier: MIT
"""Fixtures: one store per backend, each test on its own table.

A service that cannot be reached skips the test locally and FAILS it in CI (CI=true).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly.stores.memory import MemoryStore
from onceonly.testing import ManualClock

PG_URL = os.environ.get("ONCEONLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("ONCEONLY_TEST_REDIS", "redis://127.0.0.1:6379/0")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
MYSQL_URL = os.environ.get("ONCEONLY_TEST_MYSQL", "mysql://root@127.0.0.1:3306/test")
# PgBouncer in front of PG_URL's server (scripts/services pgbouncer): transaction pooling
# and session pooling, 4 server connections per database.
PGBOUNCER_URL = os.environ.get(
    "ONCEONLY_TEST_PGBOUNCER", "postgresql://postgres@127.0.0.1:6442/test"
)
PGBOUNCER_SESSION_URL = os.environ.get(
    "ONCEONLY_TEST_PGBOUNCER_SESSION", "postgresql://postgres@127.0.0.1:6443/test"
)


def unavailable(what: str) -> None:
    """Skip locally, fail in CI: a missing service must never pass silently there."""
    if IN_CI:
        pytest.fail(f"{what} is not reachable, and CI requires it")
    pytest.skip(f"{what} is not reachable")


_pg_ok: bool | None = None


def require_postgres() -> str:
    global _pg_ok
    if _pg_ok is None:
        try:
            import psycopg

            with psycopg.connect(PG_URL, connect_timeout=3):
                _pg_ok = True
        except Exception:
            _pg_ok = False
    if not _pg_ok:
        unavailable(f"PostgreSQL at {PG_URL}")
    return PG_URL


_pgbouncer_ok: dict[str, bool] = {}


def require_pgbouncer(url: str = PGBOUNCER_URL) -> str:
    """``url`` (a PgBouncer in front of the test PostgreSQL), or skip / fail in CI."""
    require_postgres()
    if url not in _pgbouncer_ok:
        try:
            import psycopg

            with psycopg.connect(url, connect_timeout=3, prepare_threshold=None) as conn:
                conn.execute("SELECT 1")
            _pgbouncer_ok[url] = True
        except Exception:
            _pgbouncer_ok[url] = False
    if not _pgbouncer_ok[url]:
        unavailable(f"PgBouncer at {url} (scripts/services pgbouncer)")
    return url


_redis_ok: bool | None = None


def require_redis() -> str:
    global _redis_ok
    if _redis_ok is None:
        try:
            import redis

            with redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3) as r:
                _redis_ok = bool(r.ping())
        except Exception:
            _redis_ok = False
    if not _redis_ok:
        unavailable(f"Redis at {REDIS_URL}")
    return REDIS_URL


def drop_redis_prefix(prefix: str) -> None:
    """Delete every key under ``prefix`` (a test's own records)."""
    import redis

    with redis.Redis.from_url(REDIS_URL) as r:
        keys = list(r.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            r.delete(*keys[i : i + 500])


_mysql_ok: bool | None = None


def _mysql_connect() -> Any:
    import pymysql

    from onceonly.stores.mysql._sql import parse_url

    args = parse_url(MYSQL_URL)
    database = args.pop("database")
    conn = pymysql.connect(**args, autocommit=True, connect_timeout=3)
    conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{database}`")
    conn.select_db(database)
    return conn


def require_mysql() -> str:
    """The MariaDB/MySQL test URL (its database created if missing)."""
    global _mysql_ok
    if _mysql_ok is None:
        try:
            _mysql_connect().close()
            _mysql_ok = True
        except Exception:
            _mysql_ok = False
    if not _mysql_ok:
        unavailable(f"MariaDB/MySQL at {MYSQL_URL}")
    return MYSQL_URL


def drop_mysql_table(*tables: str) -> None:
    conn = _mysql_connect()
    try:
        cur = conn.cursor()
        for table in tables:
            cur.execute(f"DROP TABLE IF EXISTS `{table}`")
            cur.execute(f"DROP TABLE IF EXISTS `{table}_counts`")
            cur.execute(f"DROP TABLE IF EXISTS `{table}_keys`")
            cur.execute(f"DROP TABLE IF EXISTS `{table}_lateness`")
        cur.execute(
            "DELETE FROM onceonly_schema WHERE component IN %s"
            if cur.execute("SHOW TABLES LIKE 'onceonly_schema'")
            else "SELECT %s",
            ([f"records:{t}" for t in tables] + [f"outbox:{t}" for t in tables],),
        )
    finally:
        conn.close()


def unique_table() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


def drop_pg_table(table: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table} CASCADE")  # CASCADE: a partitioned
        # table's lookup function
        if conn.execute("SELECT to_regclass('onceonly_schema')").fetchone()[0]:
            conn.execute("DELETE FROM onceonly_schema WHERE component = %s", (f"records:{table}",))


# "pgpart": PostgreSQL with the time-partitioned records table (migrate(partitioned=True)).
# It runs in the directories of PARTITIONED_DIRS (the contract suite, races, admin, the
# model); elsewhere its cases are deselected (see pytest_collection_modifyitems).
# "pgbouncer": the default PostgreSQL store through transaction-mode PgBouncer
# (PGBOUNCER_URL); it runs in PGBOUNCER_DIRS (the contract suite) only.
STORE_KINDS = ["memory", "sqlite", "postgres", "pgpart", "pgbouncer", "mysql"]
SQL_KINDS = ["sqlite", "postgres", "pgpart", "pgbouncer", "mysql"]
PG_KINDS = ("postgres", "pgpart", "pgbouncer")
# Stores for leased mode only (@idempotent): every store, plus Redis (no atomic mode).
LEASED_KINDS = [*STORE_KINDS, "redis"]
PARTITIONED_DIRS = ("contract", "races", "admin", "property", "crash")
_NOT_PARTITIONED = ("test_not_migrated.py",)  # its tables must not exist yet
PGBOUNCER_DIRS = ("contract", "outbox")


def _deselected(params: Any, path: Path) -> bool:
    """Whether a case of ``pgpart`` or ``pgbouncer`` runs outside its directories."""
    kinds = {p for p in params if isinstance(p, str)}
    if "pgpart" in kinds and (
        path.parent.name not in PARTITIONED_DIRS or path.name in _NOT_PARTITIONED
    ):
        return True
    return "pgbouncer" in kinds and path.parent.name not in PGBOUNCER_DIRS


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = callspec.params.values() if callspec is not None else ()
        if _deselected(params, item.path):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def create_partitioned(table: str) -> None:
    """The partitioned records table ``table`` (later ``migrate()`` calls keep it)."""
    store = onceonly.open_store(PG_URL, table=table, outbox_table=None)
    try:
        store.migrate(partitioned=True)
    finally:
        store.close()


class StoreFactory:
    """Builds stores of one kind that share one table (so several workers meet)."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.table = unique_table()
        self.tmp_path = tmp_path
        self.url = {
            "memory": "memory://",
            "sqlite": f"sqlite:///{tmp_path / 'onceonly.db'}",
            "postgres": PG_URL,
            "pgpart": PG_URL,
            "pgbouncer": PGBOUNCER_URL,
            "redis": REDIS_URL,
            "mysql": MYSQL_URL,
        }[kind]
        if kind == "redis":
            self.table = f"{self.table}:"  # the key prefix of this test's records
        self._opened: list[Any] = []
        self._memory: MemoryStore | None = None
        self.clock = ManualClock()

    def __call__(self, **options: Any) -> Any:
        if self.kind in PG_KINDS:
            require_postgres()
        if self.kind == "pgbouncer":
            require_pgbouncer(PGBOUNCER_URL)
        if self.kind == "mysql":
            require_mysql()
        if self.kind == "pgpart" and not self._opened:
            create_partitioned(self.table)
        if self.kind == "redis":
            require_redis()
            store = onceonly.open_store(self.url, prefix=self.table, **options)
            self._opened.append(store)
            return store
        if self.kind == "memory":
            if self._memory is None:
                self._memory = MemoryStore()
            return self._memory
        options.setdefault("outbox_table", f"{self.table}_outbox")
        store = onceonly.open_store(self.url, table=self.table, **options)
        self._opened.append(store)
        return store

    def close(self) -> None:
        for s in self._opened:
            s.close()
        if self.kind in PG_KINDS and _pg_ok:
            drop_pg_table(self.table)
            drop_pg_table(f"{self.table}_ledger")
            drop_pg_table(f"{self.table}_outbox")
        if self.kind == "redis" and _redis_ok:
            drop_redis_prefix(self.table)
        if self.kind == "mysql" and _mysql_ok:
            drop_mysql_table(self.table, f"{self.table}_ledger", f"{self.table}_outbox")


@pytest.fixture(params=STORE_KINDS)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    factory = StoreFactory(request.param, tmp_path)
    yield factory
    factory.close()


@pytest.fixture(params=SQL_KINDS)
def sql_store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    factory = StoreFactory(request.param, tmp_path)
    yield factory
    factory.close()


@pytest.fixture
def pg_store_factory(tmp_path: Path) -> Iterator[StoreFactory]:
    factory = StoreFactory("postgres", tmp_path)
    yield factory
    factory.close()


@pytest.fixture(params=LEASED_KINDS)
def leased_store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Stores for leased-mode tests: every kind of ``store_factory``, plus Redis."""
    factory = StoreFactory(request.param, tmp_path)
    yield factory
    factory.close()


@pytest.fixture(params=[*SQL_KINDS, "redis"])
def shared_leased_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Stores that several processes share in leased mode: the SQL ones and Redis
    (``factory.table`` is then the key prefix)."""
    factory = StoreFactory(request.param, tmp_path)
    yield factory
    factory.close()


@pytest.fixture
def leased_store(leased_store_factory: StoreFactory) -> Any:
    s = leased_store_factory()
    s.migrate()
    return s


@pytest.fixture
def store(store_factory: StoreFactory) -> Any:
    s = store_factory()
    s.migrate()
    return s


@pytest.fixture
def sql_store(sql_store_factory: StoreFactory) -> Any:
    s = sql_store_factory()
    s.migrate()
    return s


async def _async_store(kind: str, tmp_path: Path) -> AsyncIterator[Any]:
    table = unique_table()
    if kind in PG_KINDS:
        require_postgres()
    if kind == "pgbouncer":
        require_pgbouncer(PGBOUNCER_URL)
    if kind == "pgpart":
        create_partitioned(table)
    if kind == "redis":
        require_redis()
    if kind == "mysql":
        require_mysql()
    url = {
        "memory": "memory://",
        "sqlite": f"sqlite:///{tmp_path / 'onceonly.db'}",
        "postgres": PG_URL,
        "pgpart": PG_URL,
        "pgbouncer": PGBOUNCER_URL,
        "redis": REDIS_URL,
        "mysql": MYSQL_URL,
    }[kind]
    options: dict[str, Any] = {"table": table, "outbox_table": f"{table}_outbox"}
    if kind == "memory":
        options = {}
    elif kind == "redis":
        options = {"prefix": f"{table}:"}
    store = onceonly.open_async_store(url, **options)
    await store.migrate()
    yield store
    await store.close()
    if kind in PG_KINDS:
        drop_pg_table(table)
        drop_pg_table(f"{table}_outbox")
        drop_pg_table(f"{table}_lateness")
    if kind == "redis":
        drop_redis_prefix(f"{table}:")
    if kind == "mysql":
        drop_mysql_table(table, f"{table}_outbox")


@pytest.fixture(params=STORE_KINDS)
async def async_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    async for store in _async_store(request.param, tmp_path):
        yield store


@pytest.fixture(params=LEASED_KINDS)
async def leased_async_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """Async stores for leased-mode tests: every kind of ``async_store``, plus Redis."""
    async for store in _async_store(request.param, tmp_path):
        yield store


def business_table(store: Any, name: str | None = None) -> Callable[[], int]:
    """Create a business table beside the store's records; return a row counter."""
    if isinstance(store, MemoryStore):
        raise TypeError("the memory store has no SQL")
    name = name or f"{store.table}_ledger"
    # DDL ends a transaction on MariaDB/MySQL (an implicit commit): run it on its own
    ddl = store.session if getattr(store, "dialect", None) == "mysql" else store.transaction
    with ddl() as s:
        s.execute(f"CREATE TABLE IF NOT EXISTS {name} (id TEXT NOT NULL, amount INTEGER)")

    def count() -> int:
        with store.session() as s:
            return int(s.execute(f"SELECT count(*) FROM {name}").fetchone()[0])

    return count
