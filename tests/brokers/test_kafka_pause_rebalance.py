# SPDX-License-Identifier: MIT
"""Kafka consumer: a rebalance while fetching is paused (``max_buffer`` reached).

librdkafka keeps a partition's pause across unassign/assign, and a pause or resume
applied while nothing is assigned reaches no partition. The consumer must start each new
assignment unpaused (and pause it again if its buffer is still full), or it never takes
another record after getting its partitions back.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest

import onceonly
from tests.brokers._kits import KAFKA_FAST_JOIN
from tests.brokers.test_kafka import Env

pytestmark = pytest.mark.timeout(150)

N = 600


def _member_joins_and_leaves(bootstrap: str, group: str, topic: str, seconds: float) -> None:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, **KAFKA_FAST_JOIN})
    consumer.subscribe([topic])
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        consumer.poll(0.2)
    consumer.close()


async def test_consumer_resumes_after_a_rebalance_while_its_buffer_is_full() -> None:
    env = Env(partitions=2)
    await env.start()
    other = f"{env.topic}-other"
    try:
        from onceonly.brokers.kafka._wire import ensure_topics

        await asyncio.to_thread(
            ensure_topics, {"bootstrap.servers": env.bootstrap}, [(other, 1)], 5.0
        )
        run = uuid.uuid4().hex[:8]
        for i in range(N):
            env.producer.produce(
                env.topic,
                key=f"k{i % 7}".encode(),
                value=json.dumps({"id": f"{run}-{i}"}).encode(),
                headers=[("onceonly-message-id", f"{run}-{i}".encode())],
            )
        await asyncio.to_thread(env.producer.flush, 15)
        inbox = onceonly.AsyncInbox(env.store, consumer="billing")
        slow = True

        async def handler(msg: Any, tx: Any) -> None:
            if slow:
                await asyncio.sleep(0.3)
            await tx.execute(f"INSERT INTO {env.table}_ledger (id) VALUES (?)", (msg["id"],))

        consumer = env.consumer(inbox, handler, max_buffer=50, revoke_timeout=0.5)
        task = asyncio.create_task(consumer.run())
        try:
            start = time.monotonic()
            while len(await env.ledger()) < 5:
                assert time.monotonic() - start < 60, "the consumer never started"
                await asyncio.sleep(0.2)
            # the buffer is full (fetching paused); another member joins the group on
            # another topic, then leaves: two rebalances
            await asyncio.to_thread(_member_joins_and_leaves, env.bootstrap, env.group, other, 8)
            slow = False
            start = time.monotonic()
            done = await env.ledger()
            while len(set(done)) < N and time.monotonic() - start < 60:
                await asyncio.sleep(1)
                done = await env.ledger()
            assert len(set(done)) == N, f"stalled: {len(set(done))} of {N} after the rebalance"
            assert len(done) == N, "a record's effect was doubled"
        finally:
            await consumer.stop()
            await task
    finally:
        await env.close()
