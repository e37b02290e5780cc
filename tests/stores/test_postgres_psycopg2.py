# SPDX-License-Identifier: MIT
"""Joining a caller's psycopg2 connection (and a SQLAlchemy session on psycopg2)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest

import onceonly
from tests.conftest import PG_URL, drop_pg_table, require_postgres, unique_table


@pytest.fixture
def pg2() -> Iterator[tuple[Any, Any, str]]:
    """A store, a psycopg2 connection (autocommit off, nothing sent yet), a ledger."""
    require_postgres()
    table = unique_table()
    store = onceonly.open_store(PG_URL, table=table, outbox_table=None)
    store.migrate()
    setup = psycopg2.connect(PG_URL)
    setup.autocommit = True
    setup.cursor().execute(f"CREATE TABLE {table}_ledger (id text)")
    setup.close()
    conn = psycopg2.connect(PG_URL)
    yield store, conn, table
    conn.close()
    store.close()
    drop_pg_table(table)
    drop_pg_table(f"{table}_ledger")


def _ids(table: str) -> list[str]:
    conn = psycopg2.connect(PG_URL)
    try:
        cur = conn.cursor()
        cur.execute(f"SELECT id FROM {table}_ledger ORDER BY id")
        return [r[0] for r in cur.fetchall()]
    finally:
        conn.close()


def _writer(table: str, value: str) -> Any:
    def handler(payload: Any, tx: onceonly.Tx) -> str:
        tx.execute(f"INSERT INTO {table}_ledger (id) VALUES (?)", (value,))
        return value

    return handler


def test_joined_claim_commits_and_rolls_back_with_the_caller(pg2: tuple[Any, Any, str]) -> None:
    store, conn, table = pg2
    inbox = onceonly.Inbox(store, consumer="c")
    out = inbox.process("k", {}, _writer(table, "a"), connection=conn)  # no BEGIN sent yet
    assert (out.result, out.replayed) == ("a", False)
    assert conn.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_INTRANS
    conn.rollback()
    assert _ids(table) == []
    inbox.process("k", {}, _writer(table, "b"), connection=conn)
    conn.commit()
    assert _ids(table) == ["b"]
    assert inbox.process("k", {}, _writer(table, "c")).replayed


def test_a_failing_handler_keeps_the_callers_writes(pg2: tuple[Any, Any, str]) -> None:
    store, conn, table = pg2
    inbox = onceonly.Inbox(store, consumer="c")
    conn.cursor().execute(f"INSERT INTO {table}_ledger (id) VALUES ('mine')")

    def bad(payload: Any, tx: onceonly.Tx) -> None:
        tx.execute(f"INSERT INTO {table}_ledger (id) VALUES ('handler')")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        inbox.process("k", {}, bad, connection=conn)
    conn.commit()
    assert _ids(table) == ["mine"]


def test_a_handler_that_commits_is_caught(pg2: tuple[Any, Any, str]) -> None:
    store, conn, _ = pg2
    inbox = onceonly.Inbox(store, consumer="c")
    with pytest.raises(onceonly.TransactionEnded):
        inbox.process("k", {}, lambda p, tx: tx.connection.commit(), connection=conn)


def test_autocommit_is_refused(pg2: tuple[Any, Any, str]) -> None:
    store, conn, _ = pg2
    conn.autocommit = True
    with pytest.raises(onceonly.ConfigurationError, match="autocommit"):
        onceonly.Inbox(store, consumer="c").process("k", {}, lambda p, tx: 1, connection=conn)


def test_an_uncommitted_claim_bounds_the_duplicate(pg2: tuple[Any, Any, str]) -> None:
    store, conn, table = pg2
    inbox = onceonly.Inbox(store, consumer="c", wait=0.3)
    inbox.process("k", {}, _writer(table, "a"), connection=conn)  # held, uncommitted
    started = time.monotonic()
    with pytest.raises(onceonly.InFlight):
        inbox.process("k", {}, _writer(table, "b"))
    assert time.monotonic() - started < 5
    done = threading.Timer(0.3, conn.commit)
    done.start()
    slow = onceonly.Inbox(store, consumer="c", wait=10)
    assert slow.process("k", {}, _writer(table, "c")).result == "a"  # waited, then replayed
    done.join()


def test_a_sqlalchemy_session_on_psycopg2(pg2: tuple[Any, Any, str]) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    store, _, table = pg2
    engine = create_engine(PG_URL.replace("postgresql://", "postgresql+psycopg2://", 1))
    inbox = onceonly.Inbox(store, consumer="c")

    def handler(payload: Any, tx: onceonly.Tx) -> int:
        tx.session.execute(text(f"INSERT INTO {table}_ledger (id) VALUES ('orm')"))
        return 1

    try:
        with Session(engine) as session, session.begin():
            assert inbox.process("k", {}, handler, connection=session).result == 1
        assert _ids(table) == ["orm"]
        with Session(engine) as session:
            session.begin()
            inbox.process("j", {}, handler, connection=session)
            session.rollback()
        assert _ids(table) == ["orm"]
    finally:
        engine.dispose()
