# SPDX-License-Identifier: MIT
"""A handler that ends its own transaction (docs/spec.md §1.3, docs/modes.md): whatever
it does to the connection, a delivery is never reported as a success unless the claim
and the writes committed together, and the failure is counted.

The four idioms: "catch the error, roll back, carry on", "roll back, return a value",
"commit, carry on", "commit, raise". Three deliveries of each leave at most one business
row and a ``failed`` record with three attempts. Where the driver lets the store refuse
``commit()``/``rollback()`` while the inbox's transaction is open (psycopg 3, sqlite3),
the call itself raises, so nothing after it reaches the database.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

import onceonly
from onceonly._core.state import State
from tests.conftest import (
    MYSQL_URL,
    PG_URL,
    SQL_KINDS,
    _async_store,
    drop_pg_table,
    require_mysql,
    require_postgres,
)

IDIOMS = ["rollback-carry-on", "rollback-return", "commit-carry-on", "commit-raise"]
DELIVERIES = 3


class Boom(Exception):
    """The handler's own error."""


def read(store: Any, scope: str, key: str) -> Any:
    with store.session() as s:
        return s.get(scope, key).record


def _ledger(store: Any) -> tuple[str, Callable[[], int]]:
    """A business table beside the store's records (its DDL committed on its own)."""
    name = f"{store.table}_ledger"
    with store.session() as s:
        s.execute(f"CREATE TABLE IF NOT EXISTS {name} (id TEXT NOT NULL, amount INTEGER)")

    def count() -> int:
        with store.session() as s:
            return int(s.execute(f"SELECT count(*) FROM {name}").fetchone()[0])

    return name, count


def _handler(idiom: str, table: str, end: Callable[[Any, str], None]) -> Any:
    """The handler of ``idiom``; ``end(tx, "commit"|"rollback")`` ends the transaction."""

    def handler(msg: Any, tx: Any) -> Any:
        tx.execute(f"INSERT INTO {table} (id, amount) VALUES (?, ?)", (msg["id"], 1))
        if idiom == "good":
            return "good"
        if idiom.startswith("rollback"):
            try:
                raise Boom("a step failed")
            except Boom:
                end(tx, "rollback")
            if idiom == "rollback-return":
                return "done"
            tx.execute(f"INSERT INTO {table} (id, amount) VALUES (?, ?)", (msg["id"], 2))
            return None
        end(tx, "commit")
        if idiom == "commit-raise":
            raise Boom("after the commit")
        tx.execute(f"INSERT INTO {table} (id, amount) VALUES (?, ?)", (msg["id"], 2))
        return "done"

    return handler


def _end_connection(tx: Any, how: str) -> None:
    getattr(tx.connection, how)()


def _deliver(run: Callable[[], Any]) -> list[Any]:
    """Deliver ``DELIVERIES`` times; each outcome or the exception it raised."""
    results: list[Any] = []
    for _ in range(DELIVERIES):
        try:
            results.append(run())
        except Exception as exc:
            results.append(exc)
    return results


# MariaDB/MySQL's drivers cannot be made to refuse commit()/rollback(): the inbox sees
# the ended transaction before COMMIT (never a success, counted), but what the handler
# wrote after its own commit or rollback was committed by the server already.
REFUSES = ("sqlite", "postgresql")


def _check(
    results: list[Any], rows: int, record: Any, *, counted: bool = True, refuses: bool = True
) -> None:
    """No delivery was a success; at most one business row; every failure counted."""
    successes = [r for r in results if isinstance(r, onceonly.Outcome)]
    assert successes == [], results
    if refuses:
        assert rows <= 1, (rows, results)
    if counted:
        assert record is not None, results
        assert record.state is State.FAILED and record.attempts == DELIVERIES, (record, results)


@pytest.fixture(params=SQL_KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("idiom", IDIOMS)
def test_handler_that_ends_its_transaction(sql_store: Any, idiom: str) -> None:
    """commit()/rollback() of tx.connection is never a success, and always counted."""
    table, count = _ledger(sql_store)
    inbox = onceonly.Inbox(sql_store, consumer="billing", max_attempts=10)
    handler = _handler(idiom, table, _end_connection)
    results = _deliver(lambda: inbox.process("k", {"id": "k"}, handler))
    _check(
        results,
        count(),
        read(sql_store, "billing", "k"),
        refuses=sql_store.dialect in REFUSES,
    )
    # a well-behaved redelivery then runs once and completes with its writes
    before = count()
    outcome = inbox.process("k", {"id": "k"}, _handler("good", table, _end_connection))
    assert (outcome.result, outcome.replayed, count()) == ("good", False, before + 1)


@pytest.mark.parametrize("idiom", IDIOMS)
def test_handler_that_ends_its_transaction_with_sql(sql_store: Any, idiom: str) -> None:
    """``COMMIT``/``ROLLBACK`` sent as SQL is never reported as a success either."""
    table, _ = _ledger(sql_store)
    inbox = onceonly.Inbox(sql_store, consumer="billing", max_attempts=10)

    def end(tx: Any, how: str) -> None:
        tx.execute(how.upper())

    results = _deliver(lambda: inbox.process("k", {"id": "k"}, _handler(idiom, table, end)))
    successes = [r for r in results if isinstance(r, onceonly.Outcome)]
    assert successes == [], results
    record = read(sql_store, "billing", "k")
    assert record is not None and record.state is State.FAILED, (record, results)
    assert record.attempts == DELIVERIES, (record, results)


@pytest.fixture(params=SQL_KINDS)
async def async_sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    async for store in _async_store(request.param, tmp_path):
        yield store


@pytest.mark.parametrize("idiom", IDIOMS)
async def test_async_handler_that_ends_its_transaction(async_sql_store: Any, idiom: str) -> None:
    """The same on the asyncio stores (psycopg's AsyncConnection, aiosqlite-free threads)."""
    store = async_sql_store
    table = f"{store.table}_ledger"
    async with store.session() as s:
        await s.execute(f"CREATE TABLE IF NOT EXISTS {table} (id TEXT NOT NULL, amount INTEGER)")
    inbox = onceonly.AsyncInbox(store, consumer="billing", max_attempts=10)

    async def handler(msg: Any, tx: Any) -> Any:
        conn = tx.connection
        await tx.execute(f"INSERT INTO {table} (id, amount) VALUES (?, ?)", (msg["id"], 1))
        if idiom.startswith("rollback"):
            try:
                raise Boom("a step failed")
            except Boom:
                await _maybe_await(conn.rollback())
            if idiom == "rollback-return":
                return "done"
            await tx.execute(f"INSERT INTO {table} (id, amount) VALUES (?, ?)", (msg["id"], 2))
            return None
        await _maybe_await(conn.commit())
        if idiom == "commit-raise":
            raise Boom("after the commit")
        await tx.execute(f"INSERT INTO {table} (id, amount) VALUES (?, ?)", (msg["id"], 2))
        return "done"

    results: list[Any] = []
    for _ in range(DELIVERIES):
        try:
            results.append(await inbox.process("k", {"id": "k"}, handler))
        except Exception as exc:
            results.append(exc)
    async with store.session() as s:
        rows = (await (await s.execute(f"SELECT count(*) FROM {table}")).fetchone())[0]
    async with store.session() as s:
        record = (await s.get("billing", "k")).record
    _check(results, int(rows), record, refuses=store.dialect in REFUSES)


async def _maybe_await(value: Any) -> Any:
    if hasattr(value, "__await__"):
        return await value
    return value


# -- joined: the caller's psycopg connection, and a SQLAlchemy session


@pytest.fixture
def pg_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    require_postgres()
    table = f"t_{uuid.uuid4().hex[:12]}"
    store = onceonly.open_store(PG_URL, table=table, outbox_table=None)
    store.migrate()
    yield store
    store.close()
    drop_pg_table(table)
    drop_pg_table(f"{table}_ledger")


@pytest.mark.parametrize("idiom", IDIOMS)
def test_joined_psycopg_handler_that_ends_the_callers_transaction(
    pg_store: Any, idiom: str
) -> None:
    """On the caller's own connection: never a success, at most one business row."""
    table, count = _ledger(pg_store)
    inbox = onceonly.Inbox(pg_store, consumer="billing", max_attempts=10)
    handler = _handler(idiom, table, _end_connection)

    def run() -> Any:
        with psycopg.connect(PG_URL) as conn:  # autocommit off: a lazily begun transaction
            try:
                outcome = inbox.process("k", {"id": "k"}, handler, connection=conn)
            except BaseException:
                conn.rollback()
                raise
            conn.commit()
            return outcome

    results = _deliver(run)
    _check(results, count(), read(pg_store, "billing", "k"), counted=False)


def _sa_url(kind: str, tmp_path: Path) -> tuple[str, str]:
    if kind == "sqlite":
        path = tmp_path / "sa.db"
        return f"sqlite:///{path}", f"sqlite:///{path}"
    if kind == "postgres":
        require_postgres()
        return PG_URL, PG_URL.replace("postgresql://", "postgresql+psycopg://", 1)
    require_mysql()
    return MYSQL_URL, MYSQL_URL.replace("mysql://", "mysql+pymysql://", 1)


@pytest.mark.parametrize("sa_kind", ["sqlite", "postgres", "mysql"])
@pytest.mark.parametrize("idiom", IDIOMS)
def test_sqlalchemy_session_handler_that_ends_the_transaction(
    sa_kind: str, idiom: str, tmp_path: Path
) -> None:
    """``tx.session.commit()``/``rollback()`` in a joined SQLAlchemy session."""
    store_url, sa_url = _sa_url(sa_kind, tmp_path)
    table = f"t_{uuid.uuid4().hex[:12]}"
    store = onceonly.open_store(store_url, table=table, outbox_table=None)
    store.migrate()
    engine = create_engine(sa_url)
    ledger = f"{table}_ledger"
    try:
        with engine.begin() as c:
            c.execute(text(f"CREATE TABLE {ledger} (id VARCHAR(64) NOT NULL, amount INTEGER)"))
        inbox = onceonly.Inbox(store, consumer="billing", max_attempts=10)

        def end(tx: Any, how: str) -> None:
            getattr(tx.session, how)()

        def run() -> Any:
            with Session(engine) as session:
                try:
                    outcome = inbox.process(
                        "k", {"id": "k"}, _handler(idiom, ledger, end), connection=session
                    )
                except BaseException:
                    session.rollback()
                    raise
                session.commit()
                return outcome

        results = _deliver(run)
        with engine.connect() as c:
            rows = int(c.execute(text(f"SELECT count(*) FROM {ledger}")).scalar_one())
        _check(
            results, rows, read(store, "billing", "k"), counted=False, refuses=sa_kind != "mysql"
        )
    finally:
        with engine.begin() as c:
            c.execute(text(f"DROP TABLE IF EXISTS {ledger}"))
            c.execute(text(f"DROP TABLE IF EXISTS {table}"))
        engine.dispose()
        store.close()
