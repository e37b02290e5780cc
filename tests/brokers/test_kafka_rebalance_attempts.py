# SPDX-License-Identifier: MIT
"""Kafka consumer: a rebalance while a handler runs is not the handler's failure.

A member whose partition is revoked while a handler still runs (longer than
``revoke_timeout``) must not commit that run (its position write raises
``PartitionLost`` and the transaction rolls back), but the run did not fail: the inbox
must not count it as an attempt. Counted, a record would reach ``max_attempts`` after
that many rebalances and be dead-lettered without ever failing.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

import onceonly
from onceonly.brokers.kafka import KafkaConsumer
from tests.brokers._kits import KAFKA_FAST_JOIN, kafka_read_all
from tests.brokers.test_kafka import Env, eventually

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def env1() -> AsyncIterator[Env]:
    e = Env(partitions=1)
    await e.start()
    try:
        yield e
    finally:
        await e.close()


@pytest.mark.parametrize("batch_size", [1, 2])
async def test_a_run_cut_off_by_a_rebalance_is_not_a_failed_attempt(
    env1: Env, batch_size: int
) -> None:
    """One partition, ``max_attempts=1`` (a single counted failure makes a record
    dead): a record whose first run sleeps 6 s, and a quick one (alone: beside it; with
    ``batch_size=2``: in its batch). Meanwhile a second member joins the group, and the
    first member's revoke gives up on the slow run after 0.3 s. The partition comes back
    to the first member (``client.id`` "a" sorts first for the range assignor), which
    runs the records again once the cut-off run has ended. That run rolls back
    uncounted; each record then commits once, none is dead-lettered, and the slow one's
    record counts no failed attempt."""
    tag = uuid.uuid4().hex[:6]
    slow, quick = f"slow-{tag}", f"quick-{tag}"
    await env1.send([("k1", {"id": slow}), ("k2", {"id": quick})])
    runs: list[str] = []
    first = asyncio.Event()

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        runs.append(tx.key)
        await tx.execute(f"INSERT INTO {env1.table}_ledger (id) VALUES (?)", (payload["id"],))
        if runs.count(slow) == 1 and tx.key == slow:
            first.set()
            await asyncio.sleep(6)

    inbox = onceonly.AsyncInbox(env1.store, consumer="c", max_attempts=1)

    def member(name: str) -> KafkaConsumer:
        return KafkaConsumer(
            inbox,
            handler,
            topics=[env1.topic],
            group=env1.group,
            bootstrap=env1.bootstrap,
            config={**KAFKA_FAST_JOIN, "client.id": name},
            positions_table=f"{env1.table}_pos",
            revoke_timeout=0.3,
            batch_size=batch_size,
            batch_wait=0.5,
            retry_delay=0.05,
            max_backoff=0.2,
            shutdown_timeout=8.0,
        )

    async with member("a"):
        await asyncio.wait_for(first.wait(), 40)
        async with member("b"):  # joins mid-handler
            await eventually(lambda: _ledger_has(env1, {slow, quick}), timeout=60)
            await asyncio.sleep(1.0)  # a dead letter or a second commit would come now
    dead = await asyncio.to_thread(kafka_read_all, f"{env1.topic}.dead")
    assert [dict(m.headers() or []).get("onceonly-dead-reason") for m in dead] == []
    assert sorted(await env1.ledger()) == sorted([slow, quick])  # the cut-off run rolled back
    assert runs.count(slow) >= 2
    async with env1.store.session() as session:
        record = (await session.get("c", slow)).record
    assert record is not None
    assert record.state.value == "completed"
    assert record.attempts == 0  # the cut-off run was not counted


async def _ledger_has(env: Env, keys: set[str]) -> bool:
    return keys <= set(await env.ledger())
