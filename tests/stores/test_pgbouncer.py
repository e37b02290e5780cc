# SPDX-License-Identifier: MIT
"""PostgreSQL behind PgBouncer (docs/stores.md, "Behind PgBouncer"): the default store
works through transaction pooling with no errors and each effect once.

Real PgBouncer instances from ``scripts/services pgbouncer`` (Debian's package): pool
mode transaction on 6442, session on 6443, 4 server connections per database, so the
concurrent clients below share server connections between their transactions. An
unreachable PgBouncer skips locally and fails in CI.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import onceonly
from tests.conftest import (
    PGBOUNCER_SESSION_URL,
    PGBOUNCER_URL,
    drop_pg_table,
    require_pgbouncer,
    unique_table,
)

KEYS = 80  # each delivered twice: 160 deliveries per mode
STORES = 2  # two pools (two "processes") behind one PgBouncer
WORKERS = 4  # threads per store


@pytest.fixture
def table() -> Iterator[str]:
    require_pgbouncer(PGBOUNCER_URL)
    name = unique_table()
    yield name
    for t in (name, f"{name}_ledger", f"{name}_outbox"):
        drop_pg_table(t)


def _deliver(stores: list[Any], run: Any, keys: int = KEYS) -> tuple[list[BaseException], int]:
    """Deliver each of ``keys`` keys twice, from WORKERS threads per store at once; the
    errors and the number of deliveries made."""
    jobs = [f"k-{i}" for i in range(keys)] * 2
    lock = threading.Lock()
    errors: list[BaseException] = []
    done = [0]
    start = threading.Barrier(len(stores) * WORKERS)

    def worker(store: Any) -> None:
        start.wait()
        while True:
            with lock:
                if not jobs:
                    return
                key = jobs.pop()
            try:
                run(store, key)
            except Exception as exc:
                with lock:
                    errors.append(exc)
            with lock:
                done[0] += 1

    threads = [threading.Thread(target=worker, args=(s,)) for s in stores for _ in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors, done[0]


@pytest.mark.parametrize("pipeline", [None, True, False])
def test_leased_and_atomic_deliveries_through_transaction_pooling(
    table: str, pipeline: bool | None
) -> None:
    """160 leased and 160 atomic deliveries from 8 workers on 2 pools through
    transaction-mode PgBouncer: 0 errors, each effect once, every record completed."""
    stores = [
        onceonly.open_store(PGBOUNCER_URL, table=table, outbox_table=None, pipeline=pipeline)
        for _ in range(STORES)
    ]
    try:
        stores[0].migrate()
        with stores[0].transaction() as s:
            s.execute(f"CREATE TABLE {table}_ledger (id TEXT NOT NULL)")
        effects: Counter[str] = Counter()
        lock = threading.Lock()

        def effect(msg: Any, tx: onceonly.Tx) -> str:
            with lock:
                effects[msg["id"]] += 1
            return msg["id"]

        def leased(store: Any, key: str) -> None:
            inbox = onceonly.Inbox(store, consumer="mail", mode="leased")
            out = inbox.process(key, {"id": key}, effect)
            assert out.result == key

        def write(msg: Any, tx: onceonly.Tx) -> str:
            tx.execute(f"INSERT INTO {table}_ledger (id) VALUES (?)", (msg["id"],))
            return msg["id"]

        def atomic(store: Any, key: str) -> None:
            out = onceonly.Inbox(store, consumer="billing").process(key, {"id": key}, write)
            assert out.result == key

        leased_errors, leased_done = _deliver(stores, leased)
        atomic_errors, atomic_done = _deliver(stores, atomic)
        assert (leased_done, atomic_done) == (2 * KEYS, 2 * KEYS)
        assert leased_errors == [], f"{len(leased_errors)} leased errors: {leased_errors[:3]!r}"
        assert atomic_errors == [], f"{len(atomic_errors)} atomic errors: {atomic_errors[:3]!r}"
        assert effects == Counter({f"k-{i}": 1 for i in range(KEYS)})
        with psycopg.connect(PGBOUNCER_URL, autocommit=True, prepare_threshold=None) as conn:
            ledger = Counter(r[0] for r in conn.execute(f"SELECT id FROM {table}_ledger"))
            states = conn.execute(
                f"SELECT scope, state, attempts, count(*) FROM {table} GROUP BY 1, 2, 3"
            ).fetchall()
        assert ledger == Counter({f"k-{i}": 1 for i in range(KEYS)})
        assert sorted(states) == [("billing", "completed", 0, KEYS), ("mail", "completed", 0, KEYS)]
    finally:
        for s in stores:
            s.close()


def test_async_store_through_transaction_pooling(table: str) -> None:
    """The async store: 16 concurrent tasks on 2 pools, 160 leased deliveries, 0 errors,
    each effect once."""

    async def main() -> tuple[list[BaseException], Counter[str]]:
        stores = [
            onceonly.open_async_store(PGBOUNCER_URL, table=table, outbox_table=None)
            for _ in range(STORES)
        ]
        effects: Counter[str] = Counter()
        errors: list[BaseException] = []
        try:
            await stores[0].migrate()
            jobs = [f"k-{i}" for i in range(KEYS)] * 2

            async def effect(msg: Any, tx: onceonly.AsyncTx) -> str:
                effects[msg["id"]] += 1
                await asyncio.sleep(0)
                return str(msg["id"])

            async def worker(store: Any) -> None:
                inbox = onceonly.AsyncInbox(store, consumer="mail", mode="leased")
                while jobs:
                    key = jobs.pop()
                    try:
                        await inbox.process(key, {"id": key}, effect)
                    except Exception as exc:
                        errors.append(exc)

            await asyncio.gather(*(worker(s) for s in stores for _ in range(8)))
        finally:
            for s in stores:
                await s.close()
        return errors, effects

    errors, effects = asyncio.run(main())
    assert errors == [], f"{len(errors)} errors: {errors[:3]!r}"
    assert effects == Counter({f"k-{i}": 1 for i in range(KEYS)})


def test_session_pooling_too(table: str) -> None:
    """Through session-mode PgBouncer the same deliveries work (a sanity check of the
    second instance)."""
    require_pgbouncer(PGBOUNCER_SESSION_URL)
    store = onceonly.open_store(PGBOUNCER_SESSION_URL, table=table, outbox_table=None)
    try:
        store.migrate()
        inbox = onceonly.Inbox(store, consumer="mail", mode="leased")
        for i in range(20):
            assert inbox.process(f"k-{i}", {}, lambda m, tx: 1).result == 1
            assert inbox.process(f"k-{i}", {}, lambda m, tx: 2).replayed
    finally:
        store.close()


def _ledger_and_states(table: str) -> tuple[Counter[str], list[tuple[Any, ...]]]:
    with psycopg.connect(PGBOUNCER_URL, autocommit=True, prepare_threshold=None) as conn:
        ledger = Counter(r[0] for r in conn.execute(f"SELECT id FROM {table}_ledger"))
        states = conn.execute(f"SELECT state, count(*) FROM {table} GROUP BY 1").fetchall()
    return ledger, states


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_sqlalchemy_engine_through_transaction_pooling(table: str, driver: str) -> None:
    """open_store(engine) on a SQLAlchemy engine through transaction-mode PgBouncer
    (psycopg 3, whose connections prepare by default, and psycopg2): 8 workers, 120 atomic
    deliveries of 60 keys, 0 errors, one ledger row per key."""
    from sqlalchemy import create_engine

    engine = create_engine(
        PGBOUNCER_URL.replace("postgresql://", f"postgresql+{driver}://"),
        pool_size=8,
        max_overflow=0,
    )
    options = {"prepare": None} if driver == "psycopg" else {}  # psycopg2 never prepares
    store = onceonly.open_store(engine, table=table, outbox_table=None, **options)
    try:
        store.migrate()
        with store.transaction() as s:
            s.execute(f"CREATE TABLE {table}_ledger (id TEXT NOT NULL)")

        def write(msg: Any, tx: onceonly.Tx) -> str:
            tx.execute(f"INSERT INTO {table}_ledger (id) VALUES (?)", (msg["id"],))
            return msg["id"]

        def atomic(store: Any, key: str) -> None:
            onceonly.Inbox(store, consumer="billing").process(key, {"id": key}, write)

        errors, done = _deliver([store, store], atomic, keys=60)
        assert (errors, done) == ([], 120), errors[:3]
        ledger, states = _ledger_and_states(table)
        assert ledger == Counter({f"k-{i}": 1 for i in range(60)})
        assert states == [("completed", 60)]
    finally:
        store.close()
        engine.dispose()


def test_psycopg2_connection_joined_through_transaction_pooling(table: str) -> None:
    """A caller's psycopg2 connection (through transaction-mode PgBouncer) joined by the
    claim: 4 threads, 80 deliveries of 40 keys, 0 errors, one ledger row per key."""
    import psycopg2

    store = onceonly.open_store(PGBOUNCER_URL, table=table, outbox_table=None)
    try:
        store.migrate()
        with store.transaction() as s:
            s.execute(f"CREATE TABLE {table}_ledger (id TEXT NOT NULL)")
        jobs = [f"k-{i}" for i in range(40)] * 2
        lock = threading.Lock()
        errors: list[BaseException] = []

        def write(msg: Any, tx: onceonly.Tx) -> str:
            tx.execute(f"INSERT INTO {table}_ledger (id) VALUES (?)", (msg["id"],))
            return msg["id"]

        def worker() -> None:
            conn = psycopg2.connect(PGBOUNCER_URL)
            inbox = onceonly.Inbox(store, consumer="billing")
            try:
                while True:
                    with lock:
                        if not jobs:
                            return
                        key = jobs.pop()
                    try:
                        inbox.process(key, {"id": key}, write, connection=conn)
                        conn.commit()
                    except Exception as exc:
                        conn.rollback()
                        with lock:
                            errors.append(exc)
            finally:
                conn.close()

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == [], errors[:3]
        ledger, states = _ledger_and_states(table)
        assert ledger == Counter({f"k-{i}": 1 for i in range(40)})
        assert states == [("completed", 40)]
    finally:
        store.close()


def test_prepare_option(table: str, caplog: pytest.LogCaptureFixture) -> None:
    """prepare=None finds the pooler and logs it at INFO; prepare=True keeps preparing and
    warns; prepare=False never prepares; a direct connection prepares by default."""
    from tests.conftest import PG_URL

    def opened(url: str, **options: Any) -> Any:
        store = onceonly.open_store(url, table=table, outbox_table=None, **options)
        store.migrate()
        with store.session() as s:
            threshold = s.connection.prepare_threshold
        store.close()
        return threshold

    caplog.set_level("INFO", logger="onceonly.stores.postgres")
    assert opened(PGBOUNCER_URL) is None
    assert [r.levelname for r in caplog.records] == ["INFO"]
    assert "connection pooler" in caplog.records[0].getMessage()
    caplog.clear()
    assert opened(PGBOUNCER_URL, prepare=True) == 5
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    caplog.clear()
    assert opened(PGBOUNCER_URL, prepare=False) is None
    assert opened(PG_URL) == 5
    assert opened(PG_URL, prepare=False) is None
    assert caplog.records == []
    with pytest.raises(onceonly.ConfigurationError, match="prepare must be"):
        onceonly.open_store(PG_URL, prepare="no")
