# SPDX-License-Identifier: MIT
"""Throughput of ``RabbitMQConsumer`` (inbox on PostgreSQL) against a bare aio-pika consumer.

* **publisher**: ``RabbitMQPublisher.publish`` of ``--messages`` messages, ``--in-flight``
  at a time (each waits for its publisher confirm), to a quorum queue: messages/s.
* **onceonly**: ``RabbitMQConsumer`` on a quorum queue holding ``--messages`` messages,
  inbox ``AsyncInbox(open_async_store(pg, table=<fresh>))``, a handler that only
  returns. Each message is one claim + completion transaction, then its ack.
* **bare**: an aio-pika consumer of another quorum queue with the same messages and the
  same prefetch that only acknowledges each message.

Both consumers are timed from the subscription until every message is processed and
acknowledged; the queues and the table are deleted at the end.

    .venv/bin/python bench/consumer_rabbitmq.py [--messages 5000] [--url AMQP_URL]
        [--pg URL] [--concurrency 16] [--in-flight 64]

This is a benchmark, not a test: it prints numbers and exits 0 unless it fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import time
from typing import Any

import aio_pika
import psycopg

import onceonly
from onceonly.brokers.rabbitmq import RabbitMQConsumer, RabbitMQPublisher
from onceonly.messaging import OutboxMessage

DEFAULT_AMQP = os.environ.get("ONCEONLY_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
DEFAULT_PG = os.environ.get("ONCEONLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


async def publish_all(url: str, queue: str, n: int, in_flight: int) -> float:
    """Publish ``n`` messages with ``in_flight`` unconfirmed at a time; returns messages/s."""
    messages = [
        OutboxMessage(onceonly.uuid7(), queue, json.dumps({"i": i, "pad": "x" * 64}))
        for i in range(n)
    ]
    gate = asyncio.Semaphore(in_flight)

    async def one(message: OutboxMessage) -> None:
        async with gate:
            await publisher.publish(message)

    async with RabbitMQPublisher(url) as publisher:
        await publisher.publish(OutboxMessage(onceonly.uuid7(), queue, "{}"))  # connect
        start = time.perf_counter()
        await asyncio.gather(*(one(m) for m in messages))
        elapsed = time.perf_counter() - start
    return n / elapsed


async def run_onceonly(
    url: str, pg: str, table: str, queue: str, n: int, concurrency: int
) -> tuple[float, float]:
    """Messages per second and client CPU microseconds per message."""
    if pg.startswith("postgres"):
        store = onceonly.open_async_store(
            pg, table=table, min_size=concurrency, max_size=concurrency, outbox_table=None
        )
    else:  # e.g. memory://: the consumer's own overhead, without PostgreSQL
        store = onceonly.open_async_store(pg)
    await store.migrate()
    inbox = onceonly.AsyncInbox(store, consumer="bench")
    done = asyncio.Event()
    count = 0

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        nonlocal count
        count += 1
        if count >= n:
            done.set()

    consumer = RabbitMQConsumer(inbox, handler, url=url, queue=queue, concurrency=concurrency)
    try:
        async with consumer:
            start, cpu = time.perf_counter(), time.process_time()
            await done.wait()
            await consumer.stop()  # the last handlers commit and are acked
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu
    finally:
        await store.close()
    return n / elapsed, cpu / n * 1e6


async def run_bare(url: str, queue: str, n: int, prefetch: int) -> float:
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=False)
        await channel.set_qos(prefetch_count=prefetch)
        q = await channel.get_queue(queue, ensure=True)
        done = asyncio.Event()
        count = 0

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal count
            await message.ack()
            count += 1
            if count >= n:
                done.set()

        start = time.perf_counter()
        tag = await q.consume(on_message)
        await done.wait()
        elapsed = time.perf_counter() - start
        await q.cancel(tag)
    finally:
        await connection.close()
    return n / elapsed


def drop_table(pg: str, table: str) -> None:
    with psycopg.connect(pg, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        if conn.execute("SELECT to_regclass('onceonly_schema')").fetchone()[0]:  # type: ignore[index]
            conn.execute("DELETE FROM onceonly_schema WHERE component = %s", (f"records:{table}",))


async def main_async(args: argparse.Namespace) -> None:
    suffix = f"{os.getpid()}_{secrets.token_hex(3)}"
    table = f"bench_rabbit_{suffix}"
    q_once, q_bare = f"bench-once-{suffix}", f"bench-bare-{suffix}"
    n = args.messages
    admin = await aio_pika.connect(args.url)
    channel = await admin.channel()
    try:
        # the same declarations the consumer makes (it also dead-letters to <queue>.dead)
        for q in (q_once, q_bare):
            await channel.declare_queue(
                f"{q}.dead", durable=True, arguments={"x-queue-type": "quorum"}
            )
            await channel.declare_queue(
                q,
                durable=True,
                arguments={
                    "x-queue-type": "quorum",
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": f"{q}.dead",
                },
            )
        publish_rate = await publish_all(args.url, q_once, n, args.in_flight)
        await publish_all(args.url, q_bare, n, args.in_flight)
        for q in (q_once, q_bare):  # drop the warm-up message
            msg = await (await channel.get_queue(q)).get(fail=True, timeout=5)
            await msg.ack()
        bare = await run_bare(args.url, q_bare, n, args.concurrency)
        once, cpu_us = await run_onceonly(args.url, args.pg, table, q_once, n, args.concurrency)
    finally:
        for q in (q_once, q_bare):
            for name in (q, f"{q}.dead"):
                with contextlib.suppress(Exception):
                    await channel.queue_delete(name)
        await admin.close()
        if args.pg.startswith("postgres"):
            drop_table(args.pg, table)

    where = "PG" if args.pg.startswith("postgres") else args.pg
    rows = [
        (f"publisher (confirmed, {args.in_flight} in flight)", f"{publish_rate:10.0f} msg/s"),
        ("bare aio-pika consumer (ack only)", f"{bare:10.0f} msg/s"),
        (f"onceonly RabbitMQConsumer (inbox on {where})", f"{once:10.0f} msg/s"),
        ("  client CPU per message", f"{cpu_us:10.0f} µs"),
        ("ratio onceonly / bare", f"{once / bare:10.2f}"),
    ]
    print(f"messages: {n}, consumer concurrency/prefetch: {args.concurrency}")
    for label, value in rows:
        print(f"{label + ':':<42}{value}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--url", default=DEFAULT_AMQP, help="AMQP URL")
    parser.add_argument("--pg", default=DEFAULT_PG, help="PostgreSQL URL for the inbox")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--in-flight", type=int, default=64)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
