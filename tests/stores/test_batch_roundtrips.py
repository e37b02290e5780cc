# SPDX-License-Identifier: MIT
"""Round trips of Inbox.process_batch on PostgreSQL, counted on the wire (libpq trace):
a regression in round trips fails here even though timings never gate CI."""

from __future__ import annotations

import functools
from typing import Any

import psycopg
import pytest

import onceonly
from tests.conftest import StoreFactory
from tests.stores.test_postgres_specific import round_trips


@pytest.mark.parametrize(("pipeline", "opening"), [(False, 2), (True, 1), (None, 1)])
def test_batch_round_trips(
    pg_store_factory: StoreFactory, pipeline: bool | None, opening: int
) -> None:
    """Set-based, joined to a caller's transaction: the batch's savepoint and the claim
    of every key (one statement; the savepoint rides with it unless ``pipeline=False``),
    per new message the handler's insert and its completion update (no savepoint of its
    own), and the release; a batch of replays is the claim and the release. Counted
    after a warm-up (psycopg prepares statements on their fifth run)."""
    store = pg_store_factory(pipeline=pipeline)
    store.migrate()
    table = f"{pg_store_factory.table}_ledger"
    inbox = onceonly.Inbox(store, "billing")

    def handler(payload: Any, tx: onceonly.Tx) -> None:
        tx.execute(f"INSERT INTO {table} (id) VALUES (?)", (payload,))

    with psycopg.connect(pg_store_factory.url) as caller:
        caller.execute(f"CREATE TABLE {table} (id text)")
        for r in range(6):
            warm = [(f"w{r}-{i}", f"w{r}-{i}") for i in range(5)]
            inbox.process_batch(warm, handler, connection=caller)
        for size in (5, 20):
            batch = [(f"k{size}-{i}", f"k{size}-{i}") for i in range(size)]
            run = functools.partial(inbox.process_batch, batch, handler, connection=caller)
            assert round_trips(caller, run) == opening + size * 2 + 1
            assert round_trips(caller, run) == opening + 1  # replays
        caller.rollback()


@pytest.mark.parametrize(("pipeline", "size", "opening"), [(True, 5, 1), (False, 50, 2)])
def test_batch_handler_round_trips(
    pg_store_factory: StoreFactory, pipeline: bool, size: int, opening: int
) -> None:
    """With a batch handler, a batch of any size (joined to a caller's transaction): the
    batch's savepoint with the claim of every key (apart with ``pipeline=False``), the
    handler's savepoint, its one set-based insert, the completion of every key (one
    statement), the release; a batch of replays: the claims and the release. (Large
    batches are counted without the pipeline: psycopg's pipeline may read the first
    replies while it still sends, which the trace shows as one more exchange.)"""
    store = pg_store_factory(pipeline=pipeline)
    store.migrate()
    table = f"{pg_store_factory.table}_ledger"
    inbox = onceonly.Inbox(store, "billing")

    def insert_all(messages: list[onceonly.BatchMessage], tx: onceonly.Tx) -> list[int]:
        keys = [m.key for m in messages]
        tx.connection.execute(f"INSERT INTO {table} (id) SELECT unnest(%s::text[])", (keys,))
        return [1] * len(messages)

    with psycopg.connect(pg_store_factory.url) as caller:
        caller.execute(f"CREATE TABLE {table} (id text)")
        for r in range(6):  # warm-up: psycopg prepares statements on their fifth run
            warm = [(f"w{r}-{i}", i) for i in range(size)]
            inbox.process_batch(warm, batch_handler=insert_all, connection=caller)
        batch = [(f"k{i}", i) for i in range(size)]
        run = functools.partial(
            inbox.process_batch, batch, batch_handler=insert_all, connection=caller
        )
        assert round_trips(caller, run) == opening + 4
        assert round_trips(caller, run) == opening + 1  # replays only
        cur = caller.execute(f"SELECT count(*) FROM {table} WHERE id LIKE 'k%%'")
        assert cur.fetchone() == (size,)
        caller.rollback()


def test_one_key_at_a_time_round_trips(pg_store_factory: StoreFactory) -> None:
    """The per-key path (a savepoint per message, as other stores run a batch, and the
    rerun of a batch whose handler failed after writing): savepoint and claim, insert,
    completion, release per new message; a replay without insert and completion."""
    store = pg_store_factory(pipeline=True)
    store.migrate()
    table = f"{pg_store_factory.table}_ledger"
    inbox = onceonly.Inbox(store, "billing")
    inbox._set_based = False

    def handler(payload: Any, tx: onceonly.Tx) -> None:
        tx.execute(f"INSERT INTO {table} (id) VALUES (?)", (payload,))

    with psycopg.connect(pg_store_factory.url) as caller:
        caller.execute(f"CREATE TABLE {table} (id text)")
        warm = [(f"w{i}", f"w{i}") for i in range(10)]
        inbox.process_batch(warm, handler, connection=caller)
        inbox.process_batch(warm, handler, connection=caller)
        batch = [(f"k{i}", f"k{i}") for i in range(5)]
        n = round_trips(caller, lambda: inbox.process_batch(batch, handler, connection=caller))
        assert n == 2 + 5 * 4
        n = round_trips(caller, lambda: inbox.process_batch(batch, handler, connection=caller))
        assert n == 2 + 5 * 2
        caller.rollback()
