# SPDX-License-Identifier: MIT
"""Round trips of Inbox.process_batch on PostgreSQL, counted on the wire (libpq trace):
a regression in round trips fails here even though timings never gate CI."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import onceonly
from tests.conftest import StoreFactory
from tests.stores.test_postgres_specific import round_trips


@pytest.mark.parametrize(("pipeline", "per_message"), [(False, 5), (True, 4), (None, 4)])
def test_batch_round_trips(
    pg_store_factory: StoreFactory, pipeline: bool | None, per_message: int
) -> None:
    """Joined to a caller's transaction: the batch's savepoint and release, and per new
    message its savepoint, claim, the handler's insert, the completion update and
    release (the savepoint rides with the claim unless ``pipeline=False``, by default
    too); a replay is the same without the insert and the update. Counted after a
    warm-up (psycopg prepares statements on their fifth run)."""
    store = pg_store_factory(pipeline=pipeline)
    store.migrate()
    table = f"{pg_store_factory.table}_ledger"
    inbox = onceonly.Inbox(store, "billing")

    def handler(payload: Any, tx: onceonly.Tx) -> None:
        tx.execute(f"INSERT INTO {table} (id) VALUES (?)", (payload,))

    with psycopg.connect(pg_store_factory.url) as caller:
        caller.execute(f"CREATE TABLE {table} (id text)")
        warm = [(f"w{i}", f"w{i}") for i in range(10)]
        inbox.process_batch(warm, handler, connection=caller)
        inbox.process_batch(warm, handler, connection=caller)
        batch = [(f"k{i}", f"k{i}") for i in range(5)]
        n = round_trips(caller, lambda: inbox.process_batch(batch, handler, connection=caller))
        assert n == 2 + 5 * per_message
        n = round_trips(caller, lambda: inbox.process_batch(batch, handler, connection=caller))
        assert n == 2 + 5 * (per_message - 2)
        caller.rollback()
