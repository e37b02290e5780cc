# SPDX-License-Identifier: MIT
"""Round trips of Inbox.process on PostgreSQL, counted on the wire (libpq trace) on the
store's one pooled connection: a regression in round trips fails here even though
timings never gate CI."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import onceonly
from onceonly._core.state import State, Write
from tests.conftest import StoreFactory
from tests.stores.test_postgres_specific import round_trips


@pytest.fixture(params=["plain", "partitioned"])
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """The plain and the time-partitioned table (named so that conftest keeps both)."""
    f = StoreFactory("pgpart" if request.param == "partitioned" else "postgres", tmp_path)
    yield f
    f.close()


def _counted(factory: StoreFactory, **options: Any) -> tuple[int, int]:
    """Round trips of a new message (a claim and one handler insert) and of its replay,
    after a warm-up (psycopg prepares the handler's insert on its fifth run)."""
    store = factory(min_size=1, max_size=1, **options)
    store.migrate()
    table = f"{factory.table}_ledger"
    with psycopg.connect(factory.url, autocommit=True) as admin:
        admin.execute(f"CREATE TABLE {table} (id text)")
    inbox = onceonly.Inbox(store, "billing")

    def handler(payload: Any, tx: onceonly.Tx) -> None:
        tx.execute(f"INSERT INTO {table} (id) VALUES (?)", (payload,))

    for i in range(8):
        inbox.process(f"w{i}", f"w{i}", handler)
        inbox.process(f"w{i}", f"w{i}", handler)
    conn = store.pool.getconn()  # the pool's only connection: the one every message uses
    store.pool.putconn(conn)
    new = round_trips(conn, lambda: inbox.process("k", "k", handler))
    replay = round_trips(conn, lambda: inbox.process("k", "k", handler))
    assert inbox.process("k", "k", handler).replayed
    return new, replay


def test_new_message_and_replay_round_trips(factory: StoreFactory) -> None:
    """By default BEGIN rides with the claim: a new message is BEGIN + claim, the
    handler's insert, the completion update, COMMIT (4; the claim is in_progress until
    the update, spec §1.1); a replay is BEGIN + claim, COMMIT (2)."""
    assert _counted(factory) == (4, 2)


def test_round_trips_without_the_pipeline(factory: StoreFactory) -> None:
    """``pipeline=False`` sends BEGIN on its own: one round trip more each."""
    assert _counted(factory, pipeline=False) == (5, 3)


def test_a_claim_after_psycopg_deallocated_its_statement(pg_store_factory: StoreFactory) -> None:
    """psycopg's rollback() deallocates every prepared statement, the claim's too: the
    next claim on that connection undoes its opening and parses the claim again (in its
    own transaction and joined to a caller's one)."""
    store = pg_store_factory(min_size=1, max_size=1)
    store.migrate()
    inbox = onceonly.Inbox(store, "billing")

    def handler(payload: Any, tx: onceonly.Tx) -> str:
        return str(payload)

    for i in range(3):
        assert inbox.process(f"a{i}", i, handler).result == str(i)
        with store.pool.connection() as conn:
            conn.execute("DEALLOCATE ALL")
    assert inbox.process("a0", 0, handler).replayed
    with psycopg.connect(pg_store_factory.url) as caller:
        for i in range(3):
            assert inbox.process(f"b{i}", i, handler, connection=caller).result == str(i)
            caller.commit()
            caller.execute("DEALLOCATE ALL")
            caller.commit()
    assert inbox.process("b2", 2, handler).replayed


@pytest.mark.parametrize(
    "write",
    [
        Write(State.COMPLETED, 2**62 + 5, "fp", 3, ttl_seconds=3600.25, completed=True),
        Write(
            State.IN_PROGRESS,
            9,
            None,
            0,
            lease_seconds=0.5,
            result='"r"',
            error="e\u00e9",
            payload='{"a": 1}',
            checkpoint='{"s": 2}',
        ),
    ],
    ids=["completed", "in_progress"],
)
def test_the_claim_sent_with_begin_stores_exactly_the_write(
    factory: StoreFactory, write: Write
) -> None:
    """Every value type of the claim sent on libpq directly (text, int8, float8, bool,
    NULL) is stored as the Write says: a later read returns the claimed record, and a
    second claim returns it as the existing record."""
    store = factory()
    store.migrate()
    with store.transaction() as s:
        claimed = s.claim("scope", "key", write)
    assert claimed.inserted
    with store.session() as s:
        read = s.get("scope", "key").record
    assert read == claimed.record
    with store.transaction() as s:
        again = s.claim("scope", "key", write)
    assert not again.inserted and again.record == claimed.record


def test_replays_read_first_when_most_deliveries_are_replays(factory: StoreFactory) -> None:
    """While most recent deliveries were replays, a replay is one round trip (a read
    outside any transaction, spec §1.2a); a new key then pays that read on top (5), and
    after a run of new keys it is back to 4 without it."""
    store = factory(min_size=1, max_size=1)
    store.migrate()
    table = f"{factory.table}_ledger"
    with psycopg.connect(factory.url, autocommit=True) as admin:
        admin.execute(f"CREATE TABLE {table} (id text)")
    inbox = onceonly.Inbox(store, "billing")

    def handler(payload: Any, tx: onceonly.Tx) -> None:
        tx.execute(f"INSERT INTO {table} (id) VALUES (?)", (payload,))

    inbox.process("w", "w", handler)
    for _ in range(24):
        assert inbox.process("w", "w", handler).replayed
    conn = store.pool.getconn()
    store.pool.putconn(conn)
    assert round_trips(conn, lambda: inbox.process("w", "w", handler)) == 1
    assert round_trips(conn, lambda: inbox.process("k", "k", handler)) == 5
    for i in range(24):
        inbox.process(f"n{i}", f"n{i}", handler)
    assert round_trips(conn, lambda: inbox.process("k2", "k2", handler)) == 4
    assert round_trips(conn, lambda: inbox.process("k2", "k2", handler)) == 2
