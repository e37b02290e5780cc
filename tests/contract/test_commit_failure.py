# SPDX-License-Identifier: MIT
"""A handler whose writes fail only at COMMIT (a deferred constraint) is a failed
attempt like any other: counted, and dead after ``max_attempts`` (docs/spec.md §1.3).

Before, the commit's error left the inbox as an uncounted store error: the message was
never recorded as failed, so it came back for ever (a poison message no attempt limit
stopped). PostgreSQL is where constraints can be deferred to the commit (SQLite's
deferrable foreign keys need ``PRAGMA foreign_keys`` on the store's connections, and
InnoDB has no deferred constraints).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import onceonly
from tests.conftest import PG_KINDS, PG_URL, StoreFactory


@pytest.fixture(params=PG_KINDS)
def pg_kind_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    factory = StoreFactory(request.param, tmp_path)
    yield factory
    factory.close()


@pytest.fixture
def deferred(pg_kind_factory: StoreFactory) -> Iterator[str]:
    """A child table whose foreign key is checked at COMMIT; returns its name."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name}_parent (id int PRIMARY KEY)")
        conn.execute(
            f"CREATE TABLE {name} (id int, parent int REFERENCES {name}_parent (id)"
            " DEFERRABLE INITIALLY DEFERRED)"
        )
    yield name
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}, {name}_parent")


def _row(table: str, key: str) -> tuple[Any, ...] | None:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        return conn.execute(
            f"SELECT state, attempts, error FROM {table} WHERE key = %s", (key,)
        ).fetchone()


def _children(table: str) -> int:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def test_a_failure_at_commit_is_counted_until_dead(
    pg_kind_factory: StoreFactory, deferred: str
) -> None:
    store = pg_kind_factory()
    store.migrate()
    inbox = onceonly.Inbox(store, consumer="c", max_attempts=3)
    runs = []

    def handler(payload: dict[str, int], tx: onceonly.Tx) -> str:
        runs.append(payload["n"])
        tx.execute(f"INSERT INTO {deferred} VALUES (?, ?)", (payload["n"], 42))  # no parent 42
        return "done"

    for attempt in (1, 2, 3):
        with pytest.raises(onceonly.StoreError, match="foreign key") as info:
            inbox.process("k", {"n": 1}, handler)
        assert not isinstance(info.value, onceonly.StoreUnavailable)  # not a transient one
        row = _row(store.table, "k")
        assert row is not None and row[1] == attempt, row
        assert row[0] == ("failed" if attempt < 3 else "dead")
        assert "foreign key" in row[2]
    with pytest.raises(onceonly.DeadLettered):
        inbox.process("k", {"n": 1}, handler)
    assert runs == [1, 1, 1]
    assert _children(deferred) == 0


def test_after_a_failed_commit_the_next_attempt_can_succeed(
    pg_kind_factory: StoreFactory, deferred: str
) -> None:
    """The failed commit left nothing of the handler's writes; once the parent exists,
    the retry commits them, once."""
    store = pg_kind_factory()
    store.migrate()
    inbox = onceonly.Inbox(store, consumer="c", max_attempts=5)

    def handler(payload: dict[str, int], tx: onceonly.Tx) -> str:
        tx.execute(f"INSERT INTO {deferred} VALUES (?, ?)", (payload["n"], 7))
        return "done"

    with pytest.raises(onceonly.StoreError):
        inbox.process("k", {"n": 1}, handler)
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {deferred}_parent VALUES (7)")
    outcome = inbox.process("k", {"n": 1}, handler)
    assert (outcome.result, outcome.replayed, outcome.attempt) == ("done", False, 2)
    assert inbox.process("k", {"n": 1}, handler).replayed
    assert _children(deferred) == 1
    row = _row(store.table, "k")
    assert row is not None and row[0] == "completed"


async def test_async_a_failure_at_commit_is_counted(
    pg_kind_factory: StoreFactory, deferred: str
) -> None:
    pg_kind_factory()  # the records table in this kind's layout
    store = onceonly.open_async_store(PG_URL, table=pg_kind_factory.table, outbox_table=None)
    try:
        await store.migrate()
        inbox = onceonly.AsyncInbox(store, consumer="c", max_attempts=2)

        async def handler(payload: dict[str, int], tx: onceonly.AsyncTx) -> None:
            await tx.execute(f"INSERT INTO {deferred} VALUES (?, ?)", (1, 42))

        for attempt in (1, 2):
            with pytest.raises(onceonly.StoreError, match="foreign key"):
                await inbox.process("k", {"n": 1}, handler)
            row = _row(pg_kind_factory.table, "k")
            assert row is not None and row[1] == attempt
        with pytest.raises(onceonly.DeadLettered):
            await inbox.process("k", {"n": 1}, handler)
    finally:
        await store.close()


@pytest.mark.parametrize("batch_size", [1, 4])
async def test_a_consumer_dead_letters_a_message_refused_at_commit(
    pg_kind_factory: StoreFactory, deferred: str, batch_size: int
) -> None:
    """Through a consumer (in-memory broker, PostgreSQL inbox), alone and in a batch:
    the message refused at COMMIT ends dead-lettered after max_attempts; the others of
    its batch commit once."""
    from onceonly.testing import MemoryBroker, MemoryConsumer

    pg_kind_factory()
    store = onceonly.open_async_store(PG_URL, table=pg_kind_factory.table, outbox_table=None)
    broker = MemoryBroker()
    try:
        await store.migrate()
        inbox = onceonly.AsyncInbox(store, consumer="c", max_attempts=2)
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"INSERT INTO {deferred}_parent VALUES (1)")

        async def handler(payload: dict[str, int], tx: onceonly.AsyncTx) -> None:
            await tx.execute(f"INSERT INTO {deferred} VALUES (?, ?)", (payload["n"], payload["p"]))

        for n in range(4):
            broker.send("q", {"n": n, "p": 42 if n == 2 else 1}, message_id=f"m-{n}")
        options = {"retry_delay": 0.01, "max_backoff": 0.05, "batch_size": batch_size}
        async with MemoryConsumer(inbox, handler, broker=broker, queue="q", **options):
            deadline = asyncio.get_running_loop().time() + 10
            while not broker.dead_letters.get("q.dead") or broker.depth("q"):
                assert asyncio.get_running_loop().time() < deadline, "not settled in time"
                await asyncio.sleep(0.02)
        [dead] = broker.dead_letters["q.dead"]
        assert dead.headers["onceonly-message-id"] == "m-2"
        assert "foreign key" in dead.headers["onceonly-error"]
        assert _children(deferred) == 3
        assert _row(pg_kind_factory.table, "m-2")[:2] == ("dead", 2)  # type: ignore[index]
    finally:
        await store.close()
