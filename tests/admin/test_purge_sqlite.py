# SPDX-License-Identifier: MIT
"""Retention on SQLite beside live claims (spec §8.1): workers retaking expired keys and
claiming new ones while a purger runs; two purgers at once."""

from __future__ import annotations

import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly._core.admin import Query
from onceonly._core.state import State
from onceonly.admin import Admin


def _expired(path: Path, table: str, n: int) -> None:
    now = time.time()
    with sqlite3.connect(path) as conn:
        conn.executemany(
            f"INSERT INTO {table} (scope, key, state, token, attempts, result, created_at,"
            " updated_at, completed_at, expires_at) VALUES ('s', ?, 'completed', ?, 0, '1',"
            " ?, ?, ?, ?)",
            [(f"old{i}", i, now - 120, now - 120, now - 120, now - 60) for i in range(1, n + 1)],
        )


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Any:
    store = onceonly.open_store(f"sqlite:///{tmp_path / 'p.db'}")
    store.migrate()
    yield store
    store.close()


def test_purge_beside_workers_keeps_what_they_complete(sqlite_store: Any, tmp_path: Path) -> None:
    """Every record a worker completed survives a concurrent purge; the rest is purged."""
    _expired(tmp_path / "p.db", sqlite_store.table, 1500)
    inbox = onceonly.Inbox(sqlite_store, consumer="s", ttl=3600, wait=30)
    done = threading.Event()
    latencies: list[float] = []

    def work(first: int) -> list[str]:
        mine = []
        for i in range(first, 600, 3):
            key = f"old{i + 1}" if i % 2 else f"new{i}"
            started = time.monotonic()
            inbox.process(key, i, lambda m, tx: int(m))
            latencies.append(time.monotonic() - started)
            mine.append(key)
        return mine

    def purge() -> int:
        total = 0
        while not done.is_set():
            total += Admin(sqlite_store).purge(batch_size=25, pause=0.002).deleted
        return total

    with ThreadPoolExecutor(4) as pool:
        purger = pool.submit(purge)
        workers = [pool.submit(work, w) for w in range(3)]
        processed = [k for f in workers for k in f.result(timeout=120)]
        done.set()
        assert purger.result(timeout=60) > 0
    Admin(sqlite_store).purge(pause=0)
    admin = Admin(sqlite_store)
    for key in processed:
        record = admin.show("s", key)
        assert record is not None and record.state is State.COMPLETED, key
    remaining = {(r.scope, r.key) for r in admin.iter_records(Query(limit=500))}
    assert remaining == {("s", k) for k in processed}
    assert max(latencies) < 10.0  # generous: SQLite has one writer, on a loaded machine


def test_two_purgers_share_the_work(sqlite_store: Any, tmp_path: Path) -> None:
    """Two purgers at once delete every expired record exactly once."""
    _expired(tmp_path / "p.db", sqlite_store.table, 3000)
    barrier = threading.Barrier(2)

    def purge() -> int:
        barrier.wait()
        return Admin(sqlite_store).purge(batch_size=100, pause=0).deleted

    with ThreadPoolExecutor(2) as pool:
        counts = [f.result(timeout=60) for f in [pool.submit(purge), pool.submit(purge)]]
    assert sum(counts) == 3000
    assert Admin(sqlite_store).list_records() == []
