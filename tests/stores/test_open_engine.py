# SPDX-License-Identifier: MIT
"""``open_store(engine)`` / ``open_async_store(engine)``: a store over a SQLAlchemy
engine's pool. The contract's essentials run on each dialect with a one-connection pool
(``pool_size=1, max_overflow=0``): the store has no pool of its own, and each borrowed
connection goes back as it was found."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session

import onceonly
from onceonly.testing import AsyncListPublisher, ListPublisher
from tests.conftest import (
    MYSQL_URL,
    PG_URL,
    drop_mysql_table,
    drop_pg_table,
    require_mysql,
    require_postgres,
)

KINDS = ["sqlite", "postgres", "psycopg2", "mysql"]


def _sa_url(kind: str, tmp_path: Path, *, aio: bool = False) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'engine.db'}"
    if kind in ("postgres", "psycopg2"):
        require_postgres()
        driver = "psycopg2" if kind == "psycopg2" else "psycopg"
        return PG_URL.replace("postgresql://", f"postgresql+{driver}://", 1)
    require_mysql()
    return MYSQL_URL.replace("mysql://", "mysql+aiomysql://" if aio else "mysql+pymysql://", 1)


def _drop(kind: str, *tables: str) -> None:
    if kind in ("postgres", "psycopg2"):
        for table in tables:
            drop_pg_table(table)
    elif kind == "mysql":
        drop_mysql_table(*tables)


class Opened:
    def __init__(self, kind: str, engine: Any, store: Any, table: str) -> None:
        self.kind, self.engine, self.store, self.table = kind, engine, store, table


@pytest.fixture(params=KINDS)
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opened]:
    kind = request.param
    engine = create_engine(_sa_url(kind, tmp_path), pool_size=1, max_overflow=0, pool_timeout=5)
    table = f"t_{uuid.uuid4().hex[:12]}"
    store = onceonly.open_store(engine, table=table, outbox_table=f"{table}_ob", migrate=True)
    yield Opened(kind, engine, store, table)
    store.close()
    engine.dispose()
    _drop(kind, table, f"{table}_ob")


def test_contract_essentials_on_one_pooled_connection(opened: Opened) -> None:
    """New, replay, failure and outbox + relay through a one-connection engine pool: the
    handler runs on the engine's only connection, and it is back in the pool after."""
    pool = opened.engine.pool
    inbox = onceonly.Inbox(opened.store, consumer="c")
    seen: list[int] = []

    def handler(payload: dict[str, int], tx: onceonly.Tx) -> int:
        seen.append(pool.checkedout())  # type: ignore[attr-defined]
        tx.publish("orders", payload)
        return payload["n"] * 2

    first = inbox.process("m-1", {"n": 21}, handler)
    assert (first.result, first.replayed) == (42, False)
    again = inbox.process("m-1", {"n": 21}, handler)
    assert (again.result, again.replayed) == (42, True)
    assert seen == [1]  # the store's transaction holds the engine's one connection

    def boom(payload: Any, tx: onceonly.Tx) -> None:
        tx.publish("orders", payload)
        raise RuntimeError("handler failed")

    with pytest.raises(RuntimeError):
        inbox.process("m-2", {"n": 1}, boom)
    assert inbox.process("m-2", {"n": 1}, handler).result == 2  # retried after a failure

    publisher = ListPublisher()
    stats = onceonly.Relay(opened.store, publisher).run_once()
    assert stats.published == 2  # m-1's and m-2's second attempt; the failed one is gone
    assert sorted(m.decoded()["n"] for m in publisher.messages) == [1, 21]
    assert opened.store.schema_version() == 1
    assert pool.checkedout() == 0  # type: ignore[attr-defined]


def test_leased_mode_runs_once(opened: Opened) -> None:
    """@idempotent (autocommit sessions on borrowed connections): once, then replays; a
    failure is recorded and retried."""
    calls: list[int] = []

    @onceonly.idempotent(opened.store, key=lambda n: f"n:{n}", scope="leased")
    def charge(n: int) -> int:
        calls.append(n)
        if n < 0:
            raise ValueError("negative")
        return n + 1

    assert charge(1) == 2 and charge(1) == 2
    with pytest.raises(ValueError):
        charge(-1)
    with pytest.raises(ValueError):
        charge(-1)  # a failure is not cached: it runs again
    assert calls == [1, -1, -1]
    assert opened.engine.pool.checkedout() == 0  # type: ignore[attr-defined]


def test_borrowed_connections_go_back_as_they_were(opened: Opened) -> None:
    """The driver settings the store changes (autocommit, and per dialect isolation level,
    time zone, busy timeout) are the application's again when its session gets the
    connection."""

    def settings(engine: Engine) -> tuple[Any, ...]:
        with engine.connect() as conn:
            driver = conn.connection.driver_connection
            if opened.kind == "sqlite":
                busy = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
                return driver.isolation_level, busy, driver.in_transaction
            if opened.kind in ("postgres", "psycopg2"):
                return driver.autocommit, conn.exec_driver_sql("SHOW lock_timeout").scalar()
            row = conn.exec_driver_sql(
                "SELECT @@session.time_zone, @@session.tx_isolation, @@session.autocommit"
            ).one()
            return tuple(row)

    fresh = create_engine(opened.engine.url)  # connections the store never had
    inbox = onceonly.Inbox(opened.store, consumer="c", wait=0.7)
    inbox.process("k", {"n": 1}, lambda payload, tx: 1)
    # the engine's only connection has been the store's (migrate, process)
    assert settings(opened.engine) == settings(fresh)
    fresh.dispose()


def test_joins_a_session_of_the_same_engine(opened: Opened, tmp_path: Path) -> None:
    """The README's pairing: a store over the engine, joining a Session of that engine."""
    engine = create_engine(opened.engine.url, pool_size=2, max_overflow=0)
    store = onceonly.open_store(engine, table=opened.table, outbox_table=f"{opened.table}_ob")
    inbox = onceonly.Inbox(store, consumer="j")
    with Session(engine) as session, session.begin():
        out = inbox.process(
            "s-1",
            {"n": 3},
            lambda p, tx: tx.session.execute(text("SELECT 1")).scalar(),
            connection=session,
        )
        assert out.result == 1
        assert engine.pool.checkedout() == 1  # type: ignore[attr-defined]
    assert inbox.process("s-1", {"n": 3}, lambda p, tx: 0).replayed
    engine.dispose()


def test_psycopg2_engine_refuses_the_psycopg3_only_operations(tmp_path: Path) -> None:
    engine = create_engine(_sa_url("psycopg2", tmp_path))
    store = onceonly.open_store(engine, table=f"t_{uuid.uuid4().hex[:12]}", outbox_table=None)
    with pytest.raises(onceonly.ConfigurationError, match="no operator access"):
        onceonly.Admin(store)
    with pytest.raises(onceonly.ConfigurationError, match="needs psycopg 3"):
        store.partitions.all()  # type: ignore[attr-defined]
    with pytest.raises(onceonly.ConfigurationError, match="partitioned tables need psycopg 3"):
        store.migrate(partitioned=True)  # type: ignore[call-arg]
    engine.dispose()


def test_refuses_what_it_cannot_open(tmp_path: Path) -> None:
    with pytest.raises(onceonly.UnsupportedEngine, match="in-memory"):
        onceonly.open_store(create_engine("sqlite://"))
    aio = create_async_engine(_sa_url("mysql", tmp_path, aio=True))
    with pytest.raises(onceonly.UnsupportedEngine, match="AsyncEngine goes to open_async_store"):
        onceonly.open_store(aio)
    # the MySQLdb dialect (here driving PyMySQL's module): no store speaks mysqlclient
    mysqldb = create_engine("mysql+mysqldb://root@127.0.0.1/test", module=pymysql)
    with pytest.raises(onceonly.UnsupportedEngine, match=r"mysql\+mysqldb Engine; supported: "):
        onceonly.open_store(mysqldb)
    with pytest.raises(onceonly.UnsupportedEngine, match="takes a SQLAlchemy AsyncEngine"):
        onceonly.open_async_store(create_engine("sqlite://"))
    engine: Engine = create_engine(f"sqlite:///{tmp_path / 'y.db'}")
    with pytest.raises(onceonly.UnsupportedEngine, match="unknown option lock_wait"):
        onceonly.open_store(engine, lock_wait=1)
    assert issubclass(onceonly.UnsupportedEngine, onceonly.ConfigurationError)


@pytest.fixture(params=["postgres", "mysql"])
async def opened_async(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opened]:
    kind = request.param
    engine = create_async_engine(
        _sa_url(kind, tmp_path, aio=True), pool_size=1, max_overflow=0, pool_timeout=5
    )
    table = f"t_{uuid.uuid4().hex[:12]}"
    store = onceonly.open_async_store(engine, table=table, outbox_table=f"{table}_ob")
    await store.migrate()
    yield Opened(kind, engine, store, table)
    await store.close()
    await engine.dispose()
    _drop(kind, table, f"{table}_ob")


async def test_async_contract_essentials(opened_async: Opened) -> None:
    pool = opened_async.engine.sync_engine.pool
    inbox = onceonly.AsyncInbox(opened_async.store, consumer="c")
    seen: list[int] = []

    async def handler(payload: dict[str, int], tx: onceonly.AsyncTx) -> int:
        seen.append(pool.checkedout())
        await tx.publish("orders", payload)
        return payload["n"] * 2

    assert (await inbox.process("m-1", {"n": 21}, handler)).result == 42
    assert (await inbox.process("m-1", {"n": 21}, handler)).replayed
    assert seen == [1]

    async def boom(payload: Any, tx: onceonly.AsyncTx) -> None:
        await tx.publish("orders", payload)
        raise RuntimeError("handler failed")

    with pytest.raises(RuntimeError):
        await inbox.process("m-2", {"n": 1}, boom)
    assert (await inbox.process("m-2", {"n": 1}, handler)).result == 2
    publisher = AsyncListPublisher()
    assert (await onceonly.AsyncRelay(opened_async.store, publisher).run_once()).published == 2
    assert pool.checkedout() == 0


async def test_async_cancelled_handler_gives_its_connection_back(opened_async: Opened) -> None:
    """A handler cancelled mid-transaction: the connection goes back to the engine's pool
    (replaced if it cannot be trusted), so the one-connection pool still serves."""
    import asyncio

    inbox = onceonly.AsyncInbox(opened_async.store, consumer="c")

    async def slow(payload: Any, tx: onceonly.AsyncTx) -> int:
        await asyncio.sleep(30)
        return 0

    async def quick(payload: Any, tx: onceonly.AsyncTx) -> int:
        return 1

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(inbox.process("m-1", {}, slow), 0.3)
    for _ in range(20):  # a discarded connection is given back by a task of its own
        if opened_async.engine.sync_engine.pool.checkedout() == 0:
            break
        await asyncio.sleep(0.05)
    assert (await inbox.process("m-2", {}, quick)).result == 1
