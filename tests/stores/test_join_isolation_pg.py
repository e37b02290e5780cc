# SPDX-License-Identifier: MIT
"""A joined transaction keeps the caller's isolation level and access mode
(docs/spec.md §1.1): the PostgreSQL store opens a caller's lazily begun transaction
with the ``BEGIN`` psycopg would have sent, pipeline on or off."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

import onceonly
from tests.conftest import PG_URL, drop_pg_table, require_postgres


@pytest.fixture(params=[None, False], ids=["pipeline", "no-pipeline"])
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    require_postgres()
    table = f"t_{uuid.uuid4().hex[:12]}"
    s = onceonly.open_store(PG_URL, table=table, outbox_table=None, pipeline=request.param)
    s.migrate()
    yield s
    s.close()
    drop_pg_table(table)


def _seen(tx: Any) -> tuple[str, str]:
    level = tx.execute("SHOW transaction_isolation").fetchone()[0]
    read_only = tx.execute("SHOW transaction_read_only").fetchone()[0]
    return str(level), str(read_only)


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        (psycopg.IsolationLevel.SERIALIZABLE, "serializable"),
        (psycopg.IsolationLevel.REPEATABLE_READ, "repeatable read"),
    ],
)
def test_psycopg_isolation_level_is_kept(store: Any, level: Any, expected: str) -> None:
    """SERIALIZABLE / REPEATABLE READ of a not-yet-begun psycopg transaction hold inside."""
    inbox = onceonly.Inbox(store, consumer="c")
    with psycopg.connect(PG_URL) as conn:
        conn.isolation_level = level
        outcome = inbox.process("k", {}, lambda p, tx: _seen(tx), connection=conn)
        conn.commit()
    assert tuple(outcome.result) == (expected, "off")


def test_psycopg_read_only_is_kept(store: Any) -> None:
    """A READ ONLY transaction stays read only: the claim's write is refused in it."""
    inbox = onceonly.Inbox(store, consumer="c")
    ran: list[Any] = []
    with psycopg.connect(PG_URL) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        with pytest.raises(onceonly.StoreError, match="read-only"):
            inbox.process("k", {}, lambda p, tx: ran.append(1), connection=conn)
        conn.rollback()
        # the level and access mode the caller asked for, as the transaction began
        conn.execute("SELECT 1")
        level = conn.execute("SHOW transaction_isolation").fetchone()
        read_only = conn.execute("SHOW transaction_read_only").fetchone()
        conn.rollback()
    assert ran == []
    assert (level, read_only) == (("repeatable read",), ("on",))


def test_sqlalchemy_serializable_engine_is_kept(store: Any) -> None:
    """A Session on a SERIALIZABLE engine runs the handler in a SERIALIZABLE transaction."""
    engine = create_engine(
        PG_URL.replace("postgresql://", "postgresql+psycopg://", 1),
        isolation_level="SERIALIZABLE",
    )
    inbox = onceonly.Inbox(store, consumer="c")
    try:
        with Session(engine) as session:
            outcome = inbox.process("k", {}, lambda p, tx: _seen(tx), connection=session)
            session.commit()
    finally:
        engine.dispose()
    assert tuple(outcome.result) == ("serializable", "off")
