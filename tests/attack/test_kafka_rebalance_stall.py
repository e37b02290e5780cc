# SPDX-License-Identifier: MIT
"""A rebalance while fetching is paused (``max_buffer`` reached) stalls the consumer.

A consumer whose buffer is full pauses fetching. When a rebalance happens meanwhile (a
member joins the group and leaves again) the consumer gets its partitions back, seeks to
the stored positions... and never takes another record: nothing more commits, for as
long as it runs. Without the rebalance (or with a buffer that never fills) the same
topic drains in about a second. Seen in a 3-worker chaos run with the default
``max_buffer`` (1,000): 184 of 2,000 records, then nothing for 2.5 minutes.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

from ._kafka_attack_util import BOOTSTRAP, FAST, create_topic, private_database, produce, require_services

N = 600


def _member_joins_and_leaves(group: str, topic: str, seconds: float) -> None:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": group, **FAST})
    consumer.subscribe([topic])
    end = time.time() + seconds
    while time.time() < end:
        consumer.poll(0.2)
    consumer.close()


def test_consumer_resumes_after_a_rebalance_while_its_buffer_is_full():
    require_services()
    import onceonly
    from onceonly.brokers.kafka import KafkaConsumer

    db, drop = private_database()
    run = uuid.uuid4().hex[:8]
    topic, other, group = f"attack-stall-{run}", f"attack-stall-{run}-other", f"attack-stall-{run}"

    async def main():
        create_topic(topic, 2)
        create_topic(other, 1)
        produce(topic, [dict(value=json.dumps({"n": i}).encode(), key=f"k{i % 7}".encode(),
                             headers=[("onceonly-message-id", f"{run}-{i}".encode())]) for i in range(N)])
        store = onceonly.open_async_store(db, max_size=20)
        await store.migrate()
        async with store.transaction() as s:
            await s.execute("CREATE TABLE ledger (n INTEGER)")
        inbox = onceonly.AsyncInbox(store, consumer="billing")
        slow = True

        async def handler(msg, tx):
            if slow:
                await asyncio.sleep(0.3)
            await tx.execute("INSERT INTO ledger (n) VALUES (?)", (msg["n"],))

        async def count():
            async with store.session() as s:
                cur = await s.execute("SELECT count(DISTINCT n) FROM ledger")
                return (await cur.fetchone())[0]

        consumer = KafkaConsumer(inbox, handler, topics=[topic], group=group, bootstrap=BOOTSTRAP, config=FAST,
                                 max_buffer=50, revoke_timeout=0.5)
        task = asyncio.create_task(consumer.run())
        try:
            start = time.monotonic()
            while await count() < 5:
                assert time.monotonic() - start < 60, "the consumer never started"
                await asyncio.sleep(0.2)
            # the buffer is full; another member of the group joins (on another topic), then leaves
            await asyncio.to_thread(_member_joins_and_leaves, group, other, 8)
            slow = False
            start = time.monotonic()
            done = await count()
            while done < N and time.monotonic() - start < 60:
                await asyncio.sleep(1)
                done = await count()
            assert done == N, f"stalled: {done} of {N} records committed 60 s after the rebalance"
        finally:
            await consumer.stop()
            await task
            await store.close()

    try:
        asyncio.run(main())
    finally:
        drop()
