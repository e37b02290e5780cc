# SPDX-License-Identifier: MIT
"""Retention on PostgreSQL beside live traffic (spec §8.1): purge batches skip rows a
claim holds, never delete what workers complete, never hold up claims, and two
purgers at once share the work."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

import onceonly
from onceonly._core.state import Action, Policy, State, decide
from onceonly._runtime import new_token
from onceonly.admin import Admin
from tests.conftest import PG_URL, StoreFactory


def _expired(table: str, n: int, prefix: str = "old") -> None:
    """``n`` completed records of scope ``s`` that expired a minute ago, in one statement."""
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {table} (scope, key, state, token, attempts, result, completed_at,"
            " expires_at) SELECT 's', %s || g, 'completed', g, 0, '1',"
            " clock_timestamp() - interval '2 minutes', clock_timestamp() - interval '1 minute'"
            " FROM generate_series(1, %s) AS g",
            (prefix, n),
        )


def _count(table: str, where: str = "true") -> int:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table} WHERE {where}").fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def pg(pg_store_factory: StoreFactory) -> Any:
    store = pg_store_factory(max_size=12)
    store.migrate()
    return store


def test_purge_skips_a_record_a_claim_holds(pg: Any) -> None:
    """A transaction retaking an expired key holds its row: purge neither waits nor deletes it."""
    _expired(pg.table, 50)
    with pg.transaction() as session:
        snap = session.get("s", "old7")
        decision = decide(snap.record, snap.now, None, Policy(30.0), new_token())
        assert decision.action is Action.RUN and decision.expect is not None
        assert decision.write is not None
        assert session.update("s", "old7", decision.expect, decision.write) is not None
        pool = ThreadPoolExecutor(1)  # another connection, while the row is held
        try:
            report = pool.submit(Admin(pg).purge, batch_size=10, pause=0).result(timeout=10)
        finally:
            pool.shutdown(wait=False)  # a blocked purge ends when this transaction does
        assert report.deleted == 49
    record = Admin(pg).show("s", "old7")
    assert record is not None and record.state is State.IN_PROGRESS


def test_purge_beside_workers_keeps_what_they_complete(pg: Any) -> None:
    """Workers retake expired keys and claim new ones while a purger runs: every record a
    worker completed survives; every expired record nobody retook is purged."""
    _expired(pg.table, 3000)
    inbox = onceonly.Inbox(pg, consumer="s", ttl=3600)
    done = threading.Event()
    latencies: list[float] = []

    def handler(msg: Any, tx: Any) -> int:
        return int(msg)

    def work(first: int) -> list[str]:
        mine = []
        for i in range(first, 3000, 4):
            key = f"old{i + 1}" if i % 2 else f"new{i}"
            started = time.monotonic()
            inbox.process(key, i, handler)
            latencies.append(time.monotonic() - started)
            mine.append(key)
            if len(mine) >= 150:
                break
        return mine

    def purge() -> int:
        total = 0
        while not done.is_set():
            total += Admin(pg).purge(batch_size=20, pause=0.005).deleted
        return total

    with ThreadPoolExecutor(5) as pool:
        purger = pool.submit(purge)
        workers = [pool.submit(work, w) for w in range(4)]
        processed = [k for f in workers for k in f.result(timeout=120)]
        done.set()
        purged = purger.result(timeout=60)
    assert purged > 0
    Admin(pg).purge(pause=0)
    admin = Admin(pg)
    for key in processed:
        record = admin.show("s", key)
        assert record is not None and record.state is State.COMPLETED, key
    assert _count(pg.table, "expires_at <= clock_timestamp()") == 0
    assert _count(pg.table) == len(processed)
    assert max(latencies) < 5.0  # generous: a loaded 2-core machine


def test_two_purgers_share_the_work(pg: Any) -> None:
    """Two purgers at once delete every expired record exactly once, neither blocking."""
    _expired(pg.table, 4000)
    barrier = threading.Barrier(2)

    def purge() -> int:
        barrier.wait()
        return Admin(pg).purge(batch_size=100, pause=0).deleted

    with ThreadPoolExecutor(2) as pool:
        counts = [f.result(timeout=60) for f in [pool.submit(purge), pool.submit(purge)]]
    assert sum(counts) == 4000
    assert _count(pg.table) == 0
