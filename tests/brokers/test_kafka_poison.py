# SPDX-License-Identifier: MIT
"""Kafka consumer: a record that kills its worker, among good records of its partition.

docs/brokers.md, "A worker that crashes": only the record that kills the worker is
dead-lettered; every other record commits once. Kafka keeps no delivery count, so the
consumer learns which records a dead member may have started from the store: the
positions row of each partition keeps the offset below which records were handed to
a handler (``handed``). After a (re)assignment, the records between the stored position
and that mark run alone and exclusively, their attempts counted in the store first, as
a redelivered message does on the other brokers.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator

import pytest

from tests.brokers._kits import kafka_read_all
from tests.brokers.test_kafka import Env, _count, eventually

pytestmark = pytest.mark.timeout(240)

GOOD = ["r0", "r1", "r3", "r4"]


@pytest.fixture
async def env1() -> AsyncIterator[Env]:
    e = Env(partitions=1)
    await e.start()
    try:
        yield e
    finally:
        await e.close()


async def _dead(env: Env) -> list[str]:
    records = await asyncio.to_thread(kafka_read_all, f"{env.topic}.dead")
    return [dict(r.headers() or [])["onceonly-message-id"].decode() for r in records]


# `make test` runs the default inbox (no pre-counting: the handed mark counts the crash);
# `make soak` (ONCEONLY_SOAK=1) both.
SOAK = os.environ.get("ONCEONLY_SOAK", "") not in ("", "0")


@pytest.mark.parametrize("precount", [False, True] if SOAK else [False])
async def test_only_the_worker_killing_record_is_dead_lettered(env1: Env, precount: bool) -> None:
    """Five records (distinct keys: they run at once) in one partition; the third kills
    its worker process (``os._exit``), the others insert a ledger row and take 0.3 s. A
    supervisor restarts the worker until the partition is done. The dead-letter topic
    holds the poison record alone, and each other record committed once (with an inbox
    that pre-counts every attempt, or one that does not)."""
    await env1.send([(f"k{i}", {"id": f"r{i}"}) for i in range(5)])
    exits: list[int | None] = []
    done = False
    for _ in range(8):
        proc = env1.worker(
            poison=["r2"],
            precount=precount,
            max_attempts=2,
            max_deliveries=2,
            delay=0.3,
            concurrency=8,
        )
        deadline = time.monotonic() + 40
        while proc.poll() is None and time.monotonic() < deadline:
            settled = set(await _dead(env1)) | set(await env1.ledger())
            done = settled >= {f"r{i}" for i in range(5)}
            if done:
                await asyncio.sleep(1.0)  # a later dead letter or double would show now
                break
            await asyncio.sleep(0.2)
        if proc.poll() is None:
            proc.terminate()
        exits.append(proc.wait(30))
        if done:
            break
    assert done, f"not settled after {len(exits)} worker runs (exits {exits})"
    assert await _dead(env1) == ["r2"], "a good neighbour of the poison was dead-lettered"
    assert sorted(await env1.ledger()) == GOOD  # each good record once, the poison never
    assert exits.count(7) >= 2  # the poison killed the worker (counted) before its end


async def test_the_handed_mark_stays_near_the_records_started(env1: Env) -> None:
    """300 records fetched, 4 handlers at once, SIGKILLed after 20 commits: the handed
    mark covers the records that may have run and a margin of 32 offsets (``2 *
    concurrency``, at least 32), not every record fetched; the restarted worker runs
    the rest, each once."""
    n = 300
    await env1.send([(f"k{i % 50}", {"id": f"r{i}"}) for i in range(n)])
    proc = env1.worker(delay=0.05, concurrency=4)
    try:
        await eventually(lambda: _count(env1, 20), timeout=60)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        async with env1.store.transaction() as tx:
            cur = await tx.execute(f"SELECT next_offset, handed FROM {env1.table}_pos")
            position, handed = await cur.fetchone()
        assert position <= len(await env1.ledger()) < handed
        assert handed - position <= 4 + 32 + 4, (position, handed)  # not n
        proc = env1.worker(delay=0.0, concurrency=4)
        await eventually(lambda: _count(env1, n), timeout=90)
        await asyncio.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(20)
    rows = await env1.ledger()
    assert len(rows) == n and len(set(rows)) == n
