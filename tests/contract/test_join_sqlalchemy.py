# SPDX-License-Identifier: MIT
"""Joining a SQLAlchemy 2 Session or Connection: the claim runs on the session's own
connection, in its transaction (begun lazily or not), and commits or rolls back with it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import String, create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Session, mapped_column

import onceonly
from tests.conftest import (
    MYSQL_URL,
    PG_URL,
    drop_mysql_table,
    drop_pg_table,
    require_mysql,
    require_postgres,
)

KINDS = ["sqlite", "postgres", "mysql"]


class Base(DeclarativeBase):
    pass


def _ledger(name: str) -> type[Any]:
    return type(
        f"Ledger_{name}",
        (Base,),
        {"__tablename__": name, "id": mapped_column(String(64), primary_key=True)},
    )


def _urls(kind: str, tmp_path: Path) -> tuple[str, str]:
    """The store URL and the SQLAlchemy URL of the same database."""
    if kind == "sqlite":
        path = tmp_path / "join.db"
        return f"sqlite:///{path}", f"sqlite:///{path}"
    if kind == "postgres":
        require_postgres()
        return PG_URL, PG_URL.replace("postgresql://", "postgresql+psycopg://", 1)
    require_mysql()
    return MYSQL_URL, MYSQL_URL.replace("mysql://", "mysql+pymysql://", 1)


class Joined:
    def __init__(self, store: Any, engine: Any, model: type[Any], table: str) -> None:
        self.store, self.engine, self.model, self.table = store, engine, model, table
        self.inbox = onceonly.Inbox(store, consumer="c")

    def ids(self) -> list[str]:
        with Session(self.engine) as s:
            return sorted(r.id for r in s.query(self.model))


@pytest.fixture(params=KINDS)
def joined(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Joined]:
    kind = request.param
    url, sa_url = _urls(kind, tmp_path)
    table = f"t_{uuid.uuid4().hex[:12]}"
    store = onceonly.open_store(url, table=table, outbox_table=None)
    store.migrate()
    engine = create_engine(sa_url)
    model = _ledger(f"{table}_ledger")
    model.__table__.create(engine)  # type: ignore[attr-defined]
    yield Joined(store, engine, model, table)
    model.__table__.drop(engine)  # type: ignore[attr-defined]
    Base.metadata.remove(model.__table__)  # type: ignore[attr-defined]
    engine.dispose()
    store.close()
    if kind == "postgres":
        drop_pg_table(table)
    elif kind == "mysql":
        drop_mysql_table(table)


def test_a_lazily_begun_session_is_joined_and_commits_with_it(joined: Joined) -> None:
    """Inside ``session.begin()`` with no statement sent yet: joined, no dummy query."""
    seen = []

    def handler(payload: dict[str, str], tx: onceonly.Tx) -> str:
        seen.append(tx.session)
        tx.session.add(joined.model(id=payload["id"]))  # ORM write, same transaction
        return payload["id"]

    with Session(joined.engine) as session, session.begin():
        out = joined.inbox.process("k", {"id": "a"}, handler, connection=session)
    assert (out.result, out.replayed) == ("a", False)
    assert seen == [session]
    assert joined.ids() == ["a"]
    assert joined.inbox.process("k", {"id": "a"}, handler).replayed


def test_the_sessions_rollback_undoes_the_claim(joined: Joined) -> None:
    def handler(payload: dict[str, str], tx: onceonly.Tx) -> int:
        tx.session.add(joined.model(id="b"))
        return 1

    with Session(joined.engine) as session:
        session.begin()
        joined.inbox.process("k", {}, handler, connection=session)
        session.rollback()
    assert joined.ids() == []
    assert joined.inbox.process("k", {}, lambda p, tx: 2).result == 2  # the claim was undone


def test_a_failing_handler_rolls_back_to_its_savepoint(joined: Joined) -> None:
    def bad(payload: Any, tx: onceonly.Tx) -> None:
        tx.session.execute(
            text(f"INSERT INTO {joined.table}_ledger (id) VALUES (:i)"), {"i": "handler"}
        )
        raise RuntimeError("boom")

    with Session(joined.engine) as session, session.begin():
        session.add(joined.model(id="mine"))
        session.flush()
        with pytest.raises(RuntimeError):
            joined.inbox.process("k", {}, bad, connection=session)
    assert joined.ids() == ["mine"]


def test_a_connection_is_joined_commit_as_you_go(joined: Joined) -> None:
    def handler(payload: Any, tx: onceonly.Tx) -> int:
        tx.session.execute(text(f"INSERT INTO {joined.table}_ledger (id) VALUES ('c')"))
        return 3

    with joined.engine.connect() as conn:
        assert joined.inbox.process("k", {}, handler, connection=conn).result == 3
        conn.commit()
    assert joined.ids() == ["c"]
    assert joined.inbox.process("k", {}, handler).replayed


def test_a_sync_session_is_refused_by_an_async_inbox(joined: Joined) -> None:
    import asyncio

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        return None

    inbox = onceonly.AsyncInbox(onceonly.open_async_store("memory://"), consumer="c")
    with Session(joined.engine) as session, pytest.raises(onceonly.ConfigurationError):
        asyncio.run(inbox.process("k", {}, handler, connection=session))


@pytest.fixture(params=["postgres", "mysql"])
async def async_joined(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Any, Any, str]]:
    kind = request.param
    if kind == "postgres":
        require_postgres()
        url, sa_url = PG_URL, PG_URL.replace("postgresql://", "postgresql+psycopg://", 1)
    else:
        require_mysql()
        url, sa_url = MYSQL_URL, MYSQL_URL.replace("mysql://", "mysql+aiomysql://", 1)
    table = f"t_{uuid.uuid4().hex[:12]}"
    store = onceonly.open_async_store(url, table=table, outbox_table=None)
    await store.migrate()
    engine = create_async_engine(sa_url)
    async with engine.begin() as conn:
        await conn.execute(text(f"CREATE TABLE {table}_ledger (id VARCHAR(64))"))
    yield store, engine, table
    async with engine.begin() as conn:
        await conn.execute(text(f"DROP TABLE {table}_ledger"))
    await engine.dispose()
    await store.close()
    if kind == "postgres":
        drop_pg_table(table)
    else:
        drop_mysql_table(table)


async def test_an_async_session_is_joined(async_joined: tuple[Any, Any, str]) -> None:
    store, engine, table = async_joined
    inbox = onceonly.AsyncInbox(store, consumer="c")

    async def handler(payload: dict[str, str], tx: onceonly.AsyncTx) -> str:
        await tx.session.execute(
            text(f"INSERT INTO {table}_ledger (id) VALUES (:i)"), {"i": payload["id"]}
        )
        return payload["id"]

    async with AsyncSession(engine) as session, session.begin():
        assert (await inbox.process("k", {"id": "a"}, handler, connection=session)).result == "a"
    async with AsyncSession(engine) as session:
        await session.begin()
        await inbox.process("j", {"id": "b"}, handler, connection=session)
        await session.rollback()
    async with engine.connect() as conn:
        rows = (await conn.execute(text(f"SELECT id FROM {table}_ledger"))).fetchall()
    assert [r[0] for r in rows] == ["a"]
    assert (await inbox.process("k", {"id": "a"}, handler)).replayed

    async def again(payload: Any, tx: onceonly.AsyncTx) -> str:
        return "again"

    assert (await inbox.process("j", {"id": "b"}, again)).result == "again"
