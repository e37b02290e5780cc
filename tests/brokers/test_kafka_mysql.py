# SPDX-License-Identifier: MIT
"""Kafka consumer with its positions in a MariaDB/MySQL store (``offsets="store"``).

The positions SQL (``_kafka_positions.py``) is written once for PostgreSQL, SQLite and
MySQL/MariaDB; this runs it on the real MariaDB: positions written in the handler's
transaction (alone and in batches), a second run that takes the partitions over from
the stored positions, the epoch fence against a zombie, and the handed mark.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

import onceonly
from onceonly.brokers.kafka import KafkaConsumer
from tests.brokers._kits import (
    KAFKA_BOOTSTRAP,
    KAFKA_FAST_JOIN,
    kafka_committed,
    kafka_read_all,
)
from tests.brokers.test_kafka import ROOT, eventually
from tests.conftest import (
    MYSQL_URL,
    drop_mysql_table,
    require_mysql,
    unavailable,
    unique_table,
)

pytestmark = pytest.mark.timeout(120)


class MyEnv:
    """A topic, a group, a MariaDB store with its ledger and positions tables."""

    def __init__(self, partitions: int) -> None:
        tag = uuid.uuid4().hex[:10]
        self.topic = f"kafka-my-{tag}"
        self.group = f"g-my-{tag}"
        self.table = unique_table()
        self.partitions = partitions
        self.store: Any = None
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": KAFKA_BOOTSTRAP, "linger.ms": 1})

    async def start(self) -> None:
        from onceonly.brokers.kafka._wire import ensure_topics

        url = require_mysql()
        try:
            await asyncio.to_thread(
                ensure_topics,
                {"bootstrap.servers": KAFKA_BOOTSTRAP},
                [(self.topic, self.partitions)],
                5.0,
            )
        except Exception:
            unavailable(f"Kafka (Tansu) at {KAFKA_BOOTSTRAP}")
        self.store = onceonly.open_async_store(url, table=self.table, outbox_table=None)
        await self.store.migrate()
        await asyncio.to_thread(
            _ddl, f"CREATE TABLE `{self.table}_ledger` (id VARCHAR(64) NOT NULL) ENGINE=InnoDB"
        )

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()
        drop_mysql_table(self.table, f"{self.table}_ledger", f"{self.table}_pos")

    async def send(self, records: list[tuple[str, dict[str, Any]]]) -> None:
        for key, payload in records:
            self.producer.produce(
                self.topic,
                key=key.encode(),
                value=json.dumps(payload).encode(),
                headers=[("onceonly-message-id", str(payload["id"]).encode())],
            )
        await asyncio.to_thread(self.producer.flush, 10)

    async def ledger(self) -> list[str]:
        async with self.store.transaction() as tx:
            cur = await tx.execute(f"SELECT id FROM {self.table}_ledger")
            return [r[0] for r in await cur.fetchall()]

    async def rows(self) -> dict[int, tuple[int, int, int]]:
        """part -> (next_offset, epoch, handed)."""
        async with self.store.transaction() as tx:
            cur = await tx.execute(
                f"SELECT part, next_offset, epoch, handed FROM {self.table}_pos"
                " WHERE group_name = ?",
                (self.group,),
            )
            return {int(r[0]): (int(r[1]), int(r[2]), int(r[3])) for r in await cur.fetchall()}

    def worker(self, **config: Any) -> subprocess.Popen[bytes]:
        """A consumer process (tests/brokers/_kafka_worker.py) on this MariaDB store."""
        cfg = {
            "url": MYSQL_URL,
            "table": self.table,
            "topic": self.topic,
            "group": self.group,
            "bootstrap": KAFKA_BOOTSTRAP,
            "mode": "work",
            **config,
        }
        env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
        return subprocess.Popen(
            [sys.executable, "-m", "tests.brokers._kafka_worker", json.dumps(cfg)],
            cwd=ROOT,
            env=env,
        )

    def consumer(self, inbox: onceonly.AsyncInbox, handler: Any, **kw: Any) -> KafkaConsumer:
        options = {"retry_delay": 0.05, "max_backoff": 0.2, "shutdown_timeout": 5.0, **kw}
        return KafkaConsumer(
            inbox,
            handler,
            topics=[self.topic],
            group=self.group,
            bootstrap=KAFKA_BOOTSTRAP,
            config=KAFKA_FAST_JOIN,
            positions_table=f"{self.table}_pos",
            **options,
        )


def _ddl(statement: str) -> None:
    """DDL outside the store (MariaDB commits a transaction at any DDL)."""
    import pymysql

    from onceonly.stores.mysql._sql import parse_url

    conn = pymysql.connect(**parse_url(MYSQL_URL), autocommit=True)
    try:
        conn.cursor().execute(statement)
    finally:
        conn.close()


@pytest.fixture
async def menv() -> AsyncIterator[MyEnv]:
    e = MyEnv(partitions=2)
    await e.start()
    try:
        yield e
    finally:
        await e.close()


async def _count(env: MyEnv, n: int) -> bool:
    return len(await env.ledger()) >= n


@pytest.mark.parametrize("batch_size", [1, 10])
async def test_positions_commit_with_the_effects_on_mariadb(menv: MyEnv, batch_size: int) -> None:
    """60 records over 2 partitions, in two runs of the consumer (the second takes the
    partitions over from the stored positions): each record once in the ledger; the
    stored positions and Kafka's group offsets end at each partition's end; each run
    bumped the epoch; a graceful stop leaves no record suspect (handed = position)."""

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        await tx.execute(f"INSERT INTO {menv.table}_ledger (id) VALUES (?)", (payload["id"],))

    inbox = onceonly.AsyncInbox(menv.store, consumer="c")
    assert menv.consumer(inbox, handler).offsets == "store"  # the default on MySQL
    await menv.send([(f"k{i % 5}", {"id": f"r{i}"}) for i in range(30)])
    async with menv.consumer(inbox, handler, batch_size=batch_size, batch_wait=0.1):
        await eventually(lambda: _count(menv, 30), timeout=60)
    first = await menv.rows()
    await menv.send([(f"k{i % 5}", {"id": f"r{i}"}) for i in range(30, 60)])
    async with menv.consumer(inbox, handler, batch_size=batch_size, batch_wait=0.1):
        await eventually(lambda: _count(menv, 60), timeout=60)
        await asyncio.sleep(0.5)
    rows = await menv.ledger()
    assert sorted(rows) == sorted(f"r{i}" for i in range(60))  # none lost, none doubled
    ends = {
        p: end
        for p, (_, end) in enumerate(
            await asyncio.to_thread(kafka_committed, menv.group, menv.topic)
        )
    }
    last = await menv.rows()
    assert {p: o for p, (o, _, _) in last.items()} == ends
    assert all(last[p][1] > first[p][1] for p in last)  # the second run claimed again
    assert all(handed == o for o, _, handed in last.values())  # stopped gracefully
    marks = await asyncio.to_thread(kafka_committed, menv.group, menv.topic)
    assert all(c == h for c, h in marks)


async def test_a_zombies_transaction_is_fenced_on_mariadb(menv: MyEnv) -> None:
    """Another member takes the partitions (their epoch) while a handler runs: its
    transaction fails at the position write and rolls back its effect; the record is
    processed once, by the next owner."""
    gate = asyncio.Event()
    runs: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        runs.append(tx.key)
        await tx.execute(
            f"INSERT INTO {menv.table}_ledger (id) VALUES (?)", (f"{payload['id']}#{len(runs)}",)
        )
        if len(runs) == 1:
            await gate.wait()

    await menv.send([("a", {"id": "a"})])
    inbox = onceonly.AsyncInbox(menv.store, consumer="c")
    async with menv.consumer(inbox, handler):
        await eventually(lambda: _true(len(runs) == 1), timeout=60)
        async with menv.store.transaction() as tx:  # a new member claims every partition
            await tx.execute(f"UPDATE {menv.table}_pos SET epoch = epoch + 1")
        gate.set()
        await eventually(lambda: _count(menv, 1), timeout=60)
        await asyncio.sleep(0.5)
    assert await menv.ledger() == ["a#2"]  # the zombie's run rolled back


async def _true(v: bool) -> bool:
    return v


async def test_only_the_worker_killing_record_is_dead_lettered_on_mariadb() -> None:
    """test_kafka_poison.py on MariaDB: the third of five records of one partition kills
    its worker; restarted until done, the dead-letter topic holds it alone and each of
    the others commits once (the handed mark and the counted attempts in MariaDB)."""
    env = MyEnv(partitions=1)
    await env.start()
    try:
        await env.send([(f"k{i}", {"id": f"r{i}"}) for i in range(5)])
        done, exits = False, []
        for _ in range(8):
            proc = env.worker(poison=["r2"], max_attempts=2, delay=0.3, concurrency=8)
            deadline = time.monotonic() + 40
            while proc.poll() is None and time.monotonic() < deadline:
                dead = await asyncio.to_thread(kafka_read_all, f"{env.topic}.dead")
                ids = {dict(m.headers() or [])["onceonly-message-id"].decode() for m in dead}
                done = ids | set(await env.ledger()) >= {f"r{i}" for i in range(5)}
                if done:
                    await asyncio.sleep(1.0)
                    break
                await asyncio.sleep(0.2)
            if proc.poll() is None:
                proc.terminate()
            exits.append(proc.wait(30))
            if done:
                break
        assert done, f"not settled after {len(exits)} worker runs (exits {exits})"
        dead = await asyncio.to_thread(kafka_read_all, f"{env.topic}.dead")
        assert [dict(m.headers() or [])["onceonly-message-id"] for m in dead] == [b"r2"]
        assert sorted(await env.ledger()) == ["r0", "r1", "r3", "r4"]
    finally:
        await env.close()
