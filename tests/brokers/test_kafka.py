# SPDX-License-Identifier: MIT
"""Kafka-specific consumer cases on a real Kafka-protocol broker: Tansu 0.6.0 (not
Apache Kafka; scripts/services kafka). The contract cases run in test_contract.py.

Invariant everywhere: ledger rows = distinct records, none doubled, none lost, and the
stored positions never move backwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly.brokers.kafka import KafkaConsumer
from tests.brokers._kits import KAFKA_BOOTSTRAP, KAFKA_FAST_JOIN, kafka_committed, kafka_read_all
from tests.brokers._tansu import Tansu, tansu_binary
from tests.conftest import PG_URL, drop_pg_table, require_postgres, unavailable, unique_table
from tests.e2e._proxy import TcpProxy

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]


class Env:
    """A topic, a group, a PostgreSQL store with its ledger and positions tables."""

    def __init__(self, partitions: int, bootstrap: str = KAFKA_BOOTSTRAP) -> None:
        tag = uuid.uuid4().hex[:10]
        self.bootstrap = bootstrap
        self.topic = f"kafka-{tag}"
        self.group = f"g-{tag}"
        self.table = unique_table()
        self.partitions = partitions
        self.store: Any = None
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})

    async def start(self) -> None:
        from onceonly.brokers.kafka._wire import ensure_topics

        require_postgres()
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(
                None,
                ensure_topics,
                {"bootstrap.servers": self.bootstrap},
                [(self.topic, self.partitions)],
                5.0,
            )
        except Exception:
            unavailable(f"Kafka (Tansu) at {self.bootstrap}")
        self.store = onceonly.open_async_store(PG_URL, table=self.table, outbox_table=None)
        await self.store.migrate()
        async with self.store.transaction() as tx:
            await tx.execute(f"CREATE TABLE {self.table}_ledger (id TEXT NOT NULL)")

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()
        for t in (self.table, f"{self.table}_ledger", f"{self.table}_pos"):
            drop_pg_table(t)

    async def send(self, records: list[tuple[str | None, dict[str, Any]]]) -> None:
        for key, payload in records:
            self.producer.produce(
                self.topic,
                key=key.encode() if key is not None else None,
                value=json.dumps(payload).encode(),
                headers=[("onceonly-message-id", str(payload["id"]).encode())],
            )
        await asyncio.get_running_loop().run_in_executor(None, self.producer.flush, 10)

    async def ledger(self) -> list[str]:
        async with self.store.transaction() as tx:
            cur = await tx.execute(f"SELECT id FROM {self.table}_ledger")
            return [r[0] for r in await cur.fetchall()]

    async def positions(self) -> dict[int, int]:
        try:
            async with self.store.transaction() as tx:
                cur = await tx.execute(
                    f"SELECT part, next_offset FROM {self.table}_pos WHERE group_name = ?",
                    (self.group,),
                )
                return {int(p): int(o) for p, o in await cur.fetchall()}
        except onceonly.OnceOnlyError:  # not created yet
            return {}

    def consumer(self, inbox: onceonly.AsyncInbox, handler: Any, **kw: Any) -> KafkaConsumer:
        options = {"retry_delay": 0.05, "max_backoff": 0.2, "shutdown_timeout": 5.0, **kw}
        return KafkaConsumer(
            inbox,
            handler,
            topics=[self.topic],
            group=self.group,
            bootstrap=self.bootstrap,
            config=KAFKA_FAST_JOIN,
            positions_table=f"{self.table}_pos",
            **options,
        )

    def worker(self, **config: Any) -> subprocess.Popen[bytes]:
        cfg = {
            "url": PG_URL,
            "table": self.table,
            "topic": self.topic,
            "group": self.group,
            "bootstrap": self.bootstrap,
            "mode": "work",
            **config,
        }
        env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
        return subprocess.Popen(
            [sys.executable, "-m", "tests.brokers._kafka_worker", json.dumps(cfg)],
            cwd=ROOT,
            env=env,
        )


@pytest.fixture
async def env2() -> AsyncIterator[Env]:
    e = Env(partitions=2)
    await e.start()
    try:
        yield e
    finally:
        await e.close()


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


class Watch:
    """Samples the stored positions until stopped; records any that moved backwards."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.backwards: list[tuple[int, int, int]] = []
        self.samples = 0
        self.errors: list[str] = []
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        last: dict[int, int] = {}
        while True:
            try:
                now = await self.env.positions()
            except Exception as exc:
                self.errors.append(repr(exc))
                await asyncio.sleep(0.05)
                continue
            self.samples += 1
            for p, o in now.items():
                if o < last.get(p, -1):
                    self.backwards.append((p, last[p], o))
                last[p] = max(o, last.get(p, -1))
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def highs(env: Env) -> dict[int, int]:
    return {p: end for p, (_, end) in enumerate(kafka_committed(env.group, env.topic))}


async def test_offsets_commit_with_the_effects_in_key_order(env2: Env) -> None:
    """120 records, 6 keys, 2 partitions, 8 handlers at once: each record once; records
    of one key in offset order; the positions in the store and Kafka's group offsets end
    at each partition's end."""
    records = [(f"k{n % 6}", {"id": f"r{n}", "k": f"k{n % 6}", "n": n}) for n in range(120)]
    await env2.send(records)
    running: dict[str, int] = {}
    order: dict[str, list[int]] = {}
    overlaps: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        key = payload["k"]
        if running.get(key):
            overlaps.append(key)
        running[key] = 1
        order.setdefault(key, []).append(payload["n"])
        await asyncio.sleep(random.random() * 0.01)
        await tx.execute(f"INSERT INTO {env2.table}_ledger (id) VALUES (?)", (payload["id"],))
        running[key] = 0

    inbox = onceonly.AsyncInbox(env2.store, consumer="c")
    watch = Watch(env2)
    async with env2.consumer(inbox, handler, concurrency=8):
        await eventually(lambda: _count(env2, 120))
    await watch.stop()
    rows = await env2.ledger()
    assert sorted(rows) == sorted(r[1]["id"] for r in records)  # none lost, none doubled
    assert overlaps == []
    assert all(ns == sorted(ns) for ns in order.values())
    assert watch.backwards == []
    ends = await asyncio.get_running_loop().run_in_executor(None, highs, env2)
    assert await env2.positions() == ends
    marks = await asyncio.get_running_loop().run_in_executor(
        None, kafka_committed, env2.group, env2.topic
    )
    assert all(c == h for c, h in marks)


async def test_a_batch_writes_each_partitions_position_once(env2: Env) -> None:
    """Batches of 40: the position of a partition is written once per batch (in the
    batch's transaction, after its records), not once per record; every record once."""
    n = 80
    await env2.send([(f"k{i}", {"id": f"r{i}"}) for i in range(n)])

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        await tx.execute(f"INSERT INTO {env2.table}_ledger (id) VALUES (?)", (payload["id"],))

    inbox = onceonly.AsyncInbox(env2.store, consumer="c")
    async with env2.consumer(inbox, handler, batch_size=40, batch_wait=0.2):
        await eventually(lambda: _count(env2, n))
        async with env2.store.transaction() as tx:
            cur = await tx.execute(f"SELECT part, writes FROM {env2.table}_pos")
            writes = dict(await cur.fetchall())
    rows = await env2.ledger()
    assert len(rows) == n and len(set(rows)) == n
    # 1 claim + at most one write per batch (a handful), never one per record (~40)
    assert len(writes) == 2 and all(w <= 8 for w in writes.values()), writes


async def _count(env: Env, n: int) -> bool:
    return len(await env.ledger()) >= n


@pytest.mark.parametrize("batch_size", [1, 2])
async def test_a_zombies_transaction_is_fenced_and_rolls_back(env2: Env, batch_size: int) -> None:
    """Another member takes the partition (its epoch) while a handler runs: that run's
    transaction (alone, or its whole batch) fails at its position write and rolls back its
    effect; the record is processed once, by the next owner of the partition."""
    gate = asyncio.Event()
    runs: list[int] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        runs.append(tx.attempt)
        await tx.execute(
            f"INSERT INTO {env2.table}_ledger (id) VALUES (?)", (f"{payload['id']}#{len(runs)}",)
        )
        if len(runs) == 1:
            await gate.wait()

    await env2.send([("a", {"id": "a"}), ("b", {"id": "b"})])
    inbox = onceonly.AsyncInbox(env2.store, consumer="c")
    # one at a time (ordering="partition": a batch waits behind the gate), or a batch of 2
    batched = {"batch_size": 2, "batch_wait": 1.0} if batch_size > 1 else {"ordering": "partition"}
    async with env2.consumer(inbox, handler, **batched):
        await eventually(lambda: _true(len(runs) == 1))
        async with env2.store.transaction() as tx:  # a new member claims every partition
            await tx.execute(f"UPDATE {env2.table}_pos SET epoch = epoch + 1")
        gate.set()
        await eventually(lambda: _count(env2, 2))
        await asyncio.sleep(0.5)
    rows = await env2.ledger()
    assert "a#1" not in rows and "b#1" not in rows  # the zombie's run rolled back
    assert sorted(r.split("#")[0] for r in rows) == ["a", "b"]


async def _true(v: bool) -> bool:
    return v


async def _has(env: Env, ids: set[str]) -> bool:
    return ids <= set(await env.ledger())


async def test_kill_9_mid_batch_loses_and_doubles_nothing(env2: Env) -> None:
    """A consumer process running batches of 20 is SIGKILLed mid-run; a new one finishes:
    every record once in the ledger, positions never moved backwards."""
    n = 400
    await env2.send([(f"k{i % 10}", {"id": f"r{i}"}) for i in range(n)])
    watch = Watch(env2)
    proc = env2.worker(batch_size=20, delay=0.005)
    try:
        await eventually(lambda: _count(env2, 60))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        done_before = len(await env2.ledger())
        assert done_before < n
        proc = env2.worker(batch_size=20)
        await eventually(lambda: _count(env2, n), timeout=60)
        await asyncio.sleep(1.0)
    finally:
        proc.terminate()
        proc.wait(20)
        await watch.stop()
    rows = await env2.ledger()
    assert len(rows) == n and len(set(rows)) == n
    assert watch.backwards == []
    assert watch.samples > 10, watch.errors[:3]


async def test_rebalance_a_member_joins_and_leaves(env2: Env) -> None:
    """While records flow, a second member joins (the partitions are split) and leaves
    (they come back): every record once, positions never backwards."""
    n = 300
    inbox = onceonly.AsyncInbox(env2.store, consumer="c")

    def handler_for(name: str) -> Any:
        async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
            await tx.execute(f"INSERT INTO {env2.table}_ledger (id) VALUES (?)", (payload["id"],))
            await asyncio.sleep(0.01)

        return handler

    watch = Watch(env2)
    sent = 0

    async def feed(upto: int) -> None:
        nonlocal sent
        await env2.send([(f"k{i % 7}", {"id": f"r{i}"}) for i in range(sent, upto)])
        sent = upto

    await feed(60)
    async with env2.consumer(inbox, handler_for("a"), concurrency=4):
        await eventually(lambda: _count(env2, 20))
        second = env2.consumer(inbox, handler_for("b"), concurrency=4)
        async with second:
            await feed(180)
            await eventually(lambda: _count(env2, 120))
        await feed(n)
        await eventually(lambda: _count(env2, n), timeout=40)
        await asyncio.sleep(0.5)
    await watch.stop()
    rows = await env2.ledger()
    assert len(rows) == n and len(set(rows)) == n
    assert watch.backwards == []


async def test_record_that_kills_the_worker_is_dead_lettered(env2: Env) -> None:
    """A record whose handler kills the process: the inbox pre-counts each attempt, so
    after max_attempts it goes to <topic>.dead with the onceonly headers; no effect."""
    await env2.send([("p", {"id": "poison"})])
    exits: list[int | None] = []
    for _ in range(4):
        proc = env2.worker(mode="crash", precount=True, max_attempts=2)
        deadline = time.monotonic() + 25
        while proc.poll() is None and time.monotonic() < deadline:
            if await _dead(env2):
                break
            await asyncio.sleep(0.1)
        if proc.poll() is None:
            proc.terminate()
        exits.append(proc.wait(20))
        if await _dead(env2):
            break
    assert exits[:2] == [7, 7]
    [record] = await asyncio.get_running_loop().run_in_executor(
        None, kafka_read_all, f"{env2.topic}.dead"
    )
    headers = {k: v.decode() for k, v in record.headers()}
    assert headers["onceonly-message-id"] == "poison"
    assert headers["onceonly-dead-reason"] == "dead-lettered"
    assert headers["onceonly-error"]
    assert record.key() == b"p"
    assert await env2.ledger() == []


async def _dead(env: Env) -> bool:
    loop = asyncio.get_running_loop()
    return bool(await loop.run_in_executor(None, kafka_read_all, f"{env.topic}.dead"))


@pytest.fixture
async def proxied(tmp_path: Path) -> AsyncIterator[tuple[Env, TcpProxy]]:
    """A private Tansu whose advertised listener is a TCP proxy in front of it: every
    connection of the clients goes through the proxy, which the test cuts."""
    binary = tansu_binary()
    if binary is None:
        unavailable("the Tansu binary (scripts/services kafka)")
    tansu = Tansu(binary, tmp_path / "tansu.log")
    proxy = TcpProxy("127.0.0.1", tansu.port).start()
    try:
        tansu.start(advertised=proxy.port)
        env = Env(partitions=2, bootstrap=f"127.0.0.1:{proxy.port}")
        await env.start()
        try:
            yield env, proxy
        finally:
            await env.close()
    finally:
        proxy.close()
        tansu.stop()


async def test_connections_cut_through_a_proxy(proxied: tuple[Env, TcpProxy]) -> None:
    """While a consumer runs, every connection to the broker is cut again and again (reset,
    a fetch or commit that never arrives, answers that never come back): every record
    once in the ledger, positions never backwards, the consumer reconnected each time."""
    env, proxy = proxied
    n = 300
    await env.send([(f"k{i % 9}", {"id": f"r{i}"}) for i in range(n)])

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        await tx.execute(f"INSERT INTO {env.table}_ledger (id) VALUES (?)", (payload["id"],))
        await asyncio.sleep(0.005)

    inbox = onceonly.AsyncInbox(env.store, consumer="c")
    watch = Watch(env)
    cuts: list[int] = []
    async with env.consumer(inbox, handler, concurrency=4, batch_size=5):
        await eventually(lambda: _count(env, 20))
        for i in range(6):
            if len(await env.ledger()) >= n:
                break
            cuts.append(len(await env.ledger()))
            if i % 3 == 0:
                proxy.drop()
            else:
                proxy.arm(lose="requests" if i % 3 == 1 else "replies", blackout=0.3)
            await asyncio.sleep(1.0)
        await eventually(lambda: _count(env, n), timeout=60)
        await asyncio.sleep(1.0)  # anything still coming would show up as a duplicate
    await watch.stop()
    rows = await env.ledger()
    assert len(rows) == n and len(set(rows)) == n  # none lost, none doubled
    assert watch.backwards == []
    assert cuts and cuts[0] < n  # cut mid-stream
    assert proxy.dropped >= 1 and proxy.accepted_after_drop >= 1  # reconnected


async def test_rebalance_forced_every_few_seconds(env2: Env) -> None:
    """A second member joins and leaves again and again while records flow (batches on
    one member, single records on the other): every record once, positions never
    backwards, and each partition really changed hands (its epoch counts assignments)."""
    n, cycles = 300, 4
    inbox = onceonly.AsyncInbox(env2.store, consumer="c")

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        await tx.execute(f"INSERT INTO {env2.table}_ledger (id) VALUES (?)", (payload["id"],))
        await asyncio.sleep(0.01)

    sent = 0

    async def feed(upto: int) -> None:
        nonlocal sent
        await env2.send([(f"k{i % 11}", {"id": f"r{i}"}) for i in range(sent, upto)])
        sent = upto

    watch = Watch(env2)
    await feed(n // (cycles + 1))
    async with env2.consumer(inbox, handler, concurrency=4, batch_size=4, batch_wait=0.05):
        await eventually(lambda: _count(env2, 10))
        for c in range(cycles):
            async with env2.consumer(inbox, handler, concurrency=2):
                await feed(n * (c + 2) // (cycles + 1))
                await asyncio.sleep(2.5)
            await asyncio.sleep(0.5)
        await eventually(lambda: _count(env2, n), timeout=60)
        await asyncio.sleep(1.0)  # anything still coming would show up as a duplicate
    await watch.stop()
    rows = await env2.ledger()
    assert len(rows) == n and len(set(rows)) == n  # none lost, none doubled
    assert watch.backwards == []
    async with env2.store.transaction() as tx:
        cur = await tx.execute(f"SELECT part, epoch FROM {env2.table}_pos")
        epochs = dict(await cur.fetchall())
    # the first assignment, then at least one move per join or leave for some partition
    assert sum(epochs.values()) >= 2 + cycles, epochs


@pytest.fixture
async def env1() -> AsyncIterator[Env]:
    e = Env(partitions=1)
    await e.start()
    try:
        yield e
    finally:
        await e.close()


@pytest.mark.parametrize("batch_size", [1, 2])
async def test_a_crash_with_an_earlier_record_in_flight_runs_it_again(
    env1: Env, batch_size: int
) -> None:
    """One partition; the first record's handler hangs while later ones (other keys)
    commit, then the process is SIGKILLed. The position stored stays at the record in
    flight (never past it), so the restarted consumer runs it: every record once."""
    n = 4
    await env1.send([(f"k{i}", {"id": f"r{i}"}) for i in range(n)])
    proc = env1.worker(batch_size=batch_size, concurrency=4, block=["r0"])
    try:
        # alone: r1..r3 commit; batches of 2: [r0, r1] hangs, [r2, r3] commits
        done = {"r1", "r2", "r3"} if batch_size == 1 else {"r2", "r3"}
        await eventually(lambda: _has(env1, done))
        await asyncio.sleep(0.5)  # a position write that would follow has happened
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert "r0" not in await env1.ledger()
        assert (await env1.positions()).get(0, 0) <= 0  # not past the record in flight
        proc = env1.worker(batch_size=batch_size, concurrency=4)
        await eventually(lambda: _count(env1, n), timeout=40)
        await asyncio.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(20)
    rows = await env1.ledger()
    assert sorted(rows) == [f"r{i}" for i in range(n)]  # r0 ran after the restart, once


@pytest.mark.parametrize("precount", [False, True])
@pytest.mark.parametrize("offsets", ["kafka", "store"])
async def test_an_inbox_that_cannot_count_crashes_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, precount: bool, offsets: str
) -> None:
    """Kafka keeps no delivery count: with offsets="kafka" on an atomic inbox that does
    not pre-count attempts, a record that kills the worker would run after every
    restart, never dead-lettered. Creating such a consumer warns and names the fix; a
    pre-counting inbox is not warned about (test_record_that_kills_the_worker_is_dead_lettered),
    nor is offsets="store", whose handed marks count such a record
    (test_kafka_poison.py)."""
    store = onceonly.open_async_store(f"sqlite:///{tmp_path / 'inbox.db'}")
    inbox = onceonly.AsyncInbox(store, consumer="c", precount_attempts=precount)
    caplog.set_level("WARNING", logger="onceonly.brokers.kafka")
    try:
        KafkaConsumer(
            inbox, _nothing, topics=["t"], group="g", bootstrap=KAFKA_BOOTSTRAP, offsets=offsets
        )
    finally:
        await store.close()
    warned = [r for r in caplog.records if "precount_attempts=True" in r.getMessage()]
    assert (warned == []) is (precount or offsets == "store")
    if warned:
        assert warned[0].levelname == "WARNING"
        assert "never dead-lettered" in warned[0].getMessage()


async def _nothing(payload: Any, tx: onceonly.AsyncTx) -> None:
    return None
