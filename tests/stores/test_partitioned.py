# SPDX-License-Identifier: MIT
"""The time-partitioned PostgreSQL layout (``migrate(partitioned=True)``): key uniqueness
across partitions under races, and dropping expired partitions without losing what
retention keeps. The contract suite, the races and the model run on this layout too
(the ``pgpart`` store kind of tests/conftest.py)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import onceonly
from onceonly import ConfigurationError, Inbox, InFlight
from tests.conftest import PG_URL, drop_pg_table, require_postgres, unique_table

SECOND = timedelta(seconds=1)


@pytest.fixture
def table() -> Iterator[str]:
    require_postgres()
    name = unique_table()
    yield name
    drop_pg_table(name)


def open_store(table: str, **options: Any) -> Any:
    return onceonly.open_store(PG_URL, table=table, outbox_table=None, **options)


def sql(query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def wait_for_boundary(lead: float) -> None:
    """Sleep until ``lead`` seconds before the next whole second (the server is local)."""
    now = time.time()
    target = int(now) + 1 - lead
    if target - now < 0.05:
        target += 1
    time.sleep(target - now)


def test_migrate_creates_the_default_and_partitions_ahead(table: str) -> None:
    store = open_store(table)
    try:
        store.migrate(partitioned=True, period=timedelta(hours=1), ahead=2)
        parts = store.partitions.all()
        assert parts[0].is_default and parts[0].name == f"{table}_pdefault"
        ours = parts[1:]
        assert len(ours) == 3
        assert all(p.end - p.start == timedelta(hours=1) for p in ours)  # type: ignore[operator]
        assert [p.start for p in ours[1:]] == [p.end for p in ours[:-1]]
        assert store.partitions.ensure(ahead=2) == []  # idempotent; the period: the newest
        created = store.partitions.ensure(ahead=4)
        assert len(created) == 2
        store.migrate()  # a later plain migrate keeps the layout
        assert store._statements.partitioned
        # another process's store finds the layout on its first connection
        other = open_store(table)
        try:
            Inbox(other, "c").process("k", {"n": 1}, lambda p, tx: p["n"])
            assert other._statements.partitioned
        finally:
            other.close()
    finally:
        store.close()


def test_bad_partitioned_migrations_are_refused(table: str) -> None:
    store = open_store(table)
    try:
        with pytest.raises(ConfigurationError, match="at least 1 second"):
            store.migrate(partitioned=True, period=timedelta(milliseconds=10))
        store.migrate()
        with pytest.raises(ConfigurationError, match="not partitioned"):
            store.migrate(partitioned=True)
        with pytest.raises(ConfigurationError, match="not partitioned"):
            store.partitions.ensure()
    finally:
        store.close()
    long = open_store("t" * 50)
    try:
        with pytest.raises(ConfigurationError, match="too long"):
            long.migrate(partitioned=True)
    finally:
        long.close()


@pytest.mark.parametrize("mode", ["atomic", "leased"])
def test_sixteen_claims_of_one_key_straddling_a_boundary_run_once(table: str, mode: str) -> None:
    """16 threads claim each new key around a partition boundary (1 s partitions): the
    claims land on both sides of it, and still one row and one run per key."""
    store = open_store(table, max_size=16)
    try:
        store.migrate(partitioned=True, period=SECOND, ahead=60)
        runs: Counter[str] = Counter()
        lock = threading.Lock()

        def handler(payload: dict[str, Any], tx: Any = None) -> str:
            with lock:
                runs[payload["key"]] += 1
            time.sleep(0.02)
            return payload["key"]

        inbox = Inbox(store, "c", wait=10)
        leased = onceonly.idempotent(store, key=lambda payload: payload["key"], scope="c", wait=10)(
            handler
        )
        rounds, threads = 6, 16
        for r in range(rounds):
            key = f"k{r}"
            barrier = threading.Barrier(threads)
            errors: list[BaseException] = []
            results: list[Any] = []

            def claim(
                i: int,
                key: str = key,
                barrier: threading.Barrier = barrier,
                results: list[Any] = results,
                errors: list[BaseException] = errors,
            ) -> None:
                try:
                    barrier.wait(timeout=10)
                    time.sleep(i * 0.002)  # spread the claims over ~30 ms
                    if mode == "atomic":
                        results.append(inbox.process(key, {"key": key}, handler).result)
                    else:
                        results.append(leased({"key": key}))
                except InFlight:
                    results.append("in-flight")
                except BaseException as exc:
                    errors.append(exc)

            wait_for_boundary(0.015)
            pool = [threading.Thread(target=claim, args=(i,)) for i in range(threads)]
            for t in pool:
                t.start()
            for t in pool:
                t.join(timeout=30)
            assert not errors, errors
            assert set(results) <= {key, "in-flight"} and key in results
        assert runs == Counter({f"k{r}": 1 for r in range(rounds)})
        rows = sql(f"SELECT key, count(*) FROM {table} GROUP BY key")
        assert sorted(rows) == [(f"k{r}", 1) for r in range(rounds)]
    finally:
        store.close()


def test_concurrent_inserts_without_the_lookup_lock_would_duplicate(table: str) -> None:
    """The guard the race test relies on: with the lookup's advisory lock removed, the
    same race inserts one key more than once (so the race test can fail)."""
    store = open_store(table, max_size=16)
    try:
        store.migrate(partitioned=True, period=SECOND, ahead=60)
        sql(
            f"CREATE OR REPLACE FUNCTION {table}_lookup(wait text, p_scope text, p_key text) "
            f"RETURNS SETOF {table} LANGUAGE plpgsql VOLATILE AS $fn$ BEGIN "
            f"PERFORM pg_sleep(0.05); RETURN QUERY SELECT * FROM {table} "
            "WHERE scope = p_scope AND key = p_key; END $fn$"
        )
        inbox = Inbox(store, "c", wait=10)
        barrier = threading.Barrier(8)

        def claim() -> None:
            barrier.wait(timeout=10)
            with contextlib.suppress(Exception):  # only the rows matter here
                inbox.process("k", {"key": "k"}, lambda p, tx: time.sleep(0.05))

        pool = [threading.Thread(target=claim) for _ in range(8)]
        for t in pool:
            t.start()
        for t in pool:
            t.join(timeout=30)
        assert sql(f"SELECT count(*) FROM {table}")[0][0] > 1
    finally:
        store.close()


def test_repeatable_read_is_refused_on_the_partitioned_layout(table: str) -> None:
    store = open_store(table)
    try:
        store.migrate(partitioned=True)
        with psycopg.connect(PG_URL) as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            with pytest.raises(ConfigurationError, match="READ COMMITTED"):
                Inbox(store, "c").process("k", {}, lambda p, tx: 1, connection=conn)
    finally:
        store.close()


def _age_records(table: str, key_prefix: str = "") -> None:
    """Let every record's expiry pass (the partition key, created_at, is left alone)."""
    sql(
        f"UPDATE {table} SET expires_at = expires_at - interval '30 days' "
        f"WHERE expires_at IS NOT NULL AND key LIKE %s",
        (key_prefix + "%",),
    )


def test_drop_expired_drops_keeps_and_waits(table: str) -> None:
    store = open_store(table)
    try:
        store.migrate(partitioned=True, period=SECOND, ahead=30)
        inbox = Inbox(store, "c", max_attempts=1)
        for i in range(5):
            inbox.process(f"done{i}", {}, lambda p, tx: 1)
        with pytest.raises(RuntimeError):
            inbox.process("dead", {}, lambda p, tx: (_ for _ in ()).throw(RuntimeError("x")))
        _age_records(table, "done")
        time.sleep(1.1)  # the partition's period is over
        # one completed record that has not expired: its partition waits
        pending = Inbox(store, "c2", ttl=3600)
        pending.process("fresh", {}, lambda p, tx: 1)
        time.sleep(1.1)

        dry = store.partitions.drop_expired(dry_run=True)
        assert dry.moved == 0 and len(dry.dropped) >= 1
        before = {p.name for p in store.partitions.all()}
        report = store.partitions.drop_expired()
        assert report.dropped == dry.dropped
        assert {w[0] for w in report.waiting} == {w[0] for w in dry.waiting}
        assert len(report.waiting) == 1  # the partition of "fresh"
        assert report.moved == 1  # "dead": retention keeps it, so it moved to DEFAULT
        after = {p.name for p in store.partitions.all()}
        assert after == before - set(report.dropped)
        rows = dict(sql(f"SELECT key, tableoid::regclass::text FROM {table}"))
        assert set(rows) == {"dead", "fresh"}
        assert rows["dead"] == f"{table}_pdefault"
        # what was kept still dedupes: the dead key is not run again
        ran: list[int] = []
        out = Inbox(store, "c", max_attempts=1)
        with pytest.raises(onceonly.DeadLettered):
            out.process("dead", {}, lambda p, tx: ran.append(1))
        assert ran == []
        # with include_dead nothing is moved (the dead record goes with its partition)
        assert store.partitions.drop_expired(include_dead=True).moved == 0
    finally:
        store.close()


def test_drop_expired_skips_a_partition_another_transaction_holds(table: str) -> None:
    store = open_store(table)
    try:
        store.migrate(partitioned=True, period=SECOND, ahead=30)
        Inbox(store, "c").process("k", {}, lambda p, tx: 1)
        _age_records(table)
        time.sleep(1.1)
        with psycopg.connect(PG_URL) as holder:
            holder.execute(f"SELECT * FROM {table} WHERE key = 'k' FOR UPDATE")
            started = time.monotonic()
            report = store.partitions.drop_expired(lock_wait=0.3)
            assert time.monotonic() - started < 3
            # detaching needs the whole table for a moment: every partition is busy
            assert report.dropped == () and report.busy
        assert set(report.busy) <= set(store.partitions.drop_expired().dropped)
    finally:
        store.close()


def test_drop_expired_while_workers_claim(table: str) -> None:
    """Partitions are dropped while 4 workers claim new and old keys: no worker fails,
    no key runs twice, no kept record is lost."""
    store = open_store(table, max_size=8)
    try:
        store.migrate(partitioned=True, period=SECOND, ahead=30)
        inbox = Inbox(store, "c", ttl=0.2)
        runs: Counter[str] = Counter()
        lock = threading.Lock()
        stop = threading.Event()
        errors: list[BaseException] = []

        def handler(payload: dict[str, Any], tx: Any) -> None:
            with lock:
                runs[payload["k"]] += 1

        def worker(w: int) -> None:
            n = 0
            try:
                while not stop.is_set():
                    key = f"w{w}-{n}"
                    inbox.process(key, {"k": key}, handler)
                    n += 1
            except BaseException as exc:
                errors.append(exc)

        pool = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
        for t in pool:
            t.start()
        dropped: list[str] = []
        try:
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                time.sleep(0.3)
                dropped += store.partitions.drop_expired(lock_wait=0.5).dropped
        finally:
            stop.set()
            for t in pool:
                t.join(timeout=30)
        assert not errors, errors
        assert dropped, "no partition was dropped in 4 s"
        assert runs and max(runs.values()) == 1
    finally:
        store.close()


def test_ensure_skips_a_range_whose_rows_wait_in_default(table: str) -> None:
    store = open_store(table)
    try:
        store.migrate(partitioned=True, period=SECOND, ahead=0)
        time.sleep(1.1)  # now no partition covers the clock: claims land in DEFAULT
        Inbox(store, "c").process("k", {}, lambda p, tx: 1)
        assert sql(f"SELECT tableoid::regclass::text FROM {table}") == [(f"{table}_pdefault",)]
        created = store.partitions.ensure(ahead=3)
        starts = [p.start for p in store.partitions.all() if p.name in created]
        row_at = sql(f"SELECT created_at FROM {table}")[0][0]
        assert all(not (s <= row_at < s + SECOND) for s in starts)  # type: ignore[operator]
        assert len(created) in (2, 3, 4)
    finally:
        store.close()


def test_purge_reaches_every_partition(table: str) -> None:
    store = open_store(table)
    try:
        store.migrate(partitioned=True, period=SECOND, ahead=30)
        inbox = Inbox(store, "c")
        for i in range(3):
            inbox.process(f"a{i}", {}, lambda p, tx: 1)
        time.sleep(1.05)
        for i in range(3):
            inbox.process(f"b{i}", {}, lambda p, tx: 1)
        assert len(sql(f"SELECT DISTINCT tableoid FROM {table}")) >= 2  # a busy machine: 3
        _age_records(table)
        summary = onceonly.Admin(store).purge(batch_size=2, pause=0)
        assert summary.deleted == 6
        assert sql(f"SELECT count(*) FROM {table}") == [(0,)]
    finally:
        store.close()
