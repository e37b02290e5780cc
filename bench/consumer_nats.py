# SPDX-License-Identifier: MIT
"""Throughput of ``NatsConsumer`` (inbox on PostgreSQL) against a bare JetStream consumer.

* **publisher**: ``NatsPublisher.publish`` of ``--messages`` outbox messages, each
  awaited until its PubAck, ``--in-flight`` (64) publishes running concurrently. These
  messages, in a fresh stream, are the input of both consumers.
* **bare**: a durable pull consumer that fetches ``--batch`` messages at a time and acks
  each one. No inbox, no database: the ceiling of consuming this stream from Python.
* **onceonly**: ``NatsConsumer`` with ``batch=--batch`` (concurrency the same) on an
  ``AsyncInbox`` over ``open_async_store(url, table=<fresh>)`` (one claim + completion
  transaction per message on PostgreSQL); the handler only returns.

Each consumer has its own durable on the same stream, so each sees all messages. Time
runs from start to the moment every message is acked (the broker's ack floor). The
stream and the records table are deleted at the end.

    .venv/bin/python bench/consumer_nats.py [--messages 5000] [--url nats://127.0.0.1:4222]
        [--pg postgresql://postgres@127.0.0.1:5432/test] [--batch 32] [--in-flight 64]

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
import uuid
from typing import Any

import nats
import psycopg
from nats.aio.client import Client
from nats.js import JetStreamContext, api

import onceonly
from onceonly.brokers.nats import NatsConsumer, NatsPublisher
from onceonly.inbox import AsyncTx
from onceonly.messaging import OutboxMessage

DEFAULT_NATS = os.environ.get("ONCEONLY_TEST_NATS", "nats://127.0.0.1:4222")
DEFAULT_PG = os.environ.get(
    "ONCEONLY_BENCH_PG",
    os.environ.get("ONCEONLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"),
)


async def publish_all(url: str, subject: str, n: int, in_flight: int) -> float:
    """Publish ``n`` messages with confirmation, ``in_flight`` at a time; seconds taken."""
    messages = [
        OutboxMessage(
            id=str(uuid.uuid4()),
            topic=subject,
            payload=json.dumps({"n": i, "amount": i % 100}),
        )
        for i in range(n)
    ]
    queue: asyncio.Queue[OutboxMessage] = asyncio.Queue()
    for m in messages:
        queue.put_nowait(m)
    async with NatsPublisher(url) as pub:
        await pub.publish(OutboxMessage(id="warm-up", topic=subject + ".warmup", payload="{}"))

        async def worker() -> None:
            while not queue.empty():
                await pub.publish(queue.get_nowait())

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        return time.perf_counter() - started


async def acked_all(js: JetStreamContext, stream: str, durable: str, n: int) -> bool:
    info = await js.consumer_info(stream, durable)
    return bool(
        info.delivered.consumer_seq >= n and info.num_pending == 0 and info.num_ack_pending == 0
    )


async def bare(nc: Client, stream: str, subject: str, n: int, batch: int) -> float:
    """A pull consumer that only acks; seconds to ack ``n`` messages."""
    js = nc.jetstream()
    config = api.ConsumerConfig(
        ack_policy=api.AckPolicy.EXPLICIT, ack_wait=30, max_deliver=-1, filter_subject=subject
    )
    sub = await js.pull_subscribe(subject, durable="bare", stream=stream, config=config)
    done = 0
    started = time.perf_counter()
    while done < n:
        try:
            msgs = await sub.fetch(batch, timeout=1)
        except asyncio.TimeoutError:
            continue
        for msg in msgs:
            await msg.ack()
        done += len(msgs)
    await nc.flush()
    while not await acked_all(js, stream, "bare", n):
        await asyncio.sleep(0.005)
    elapsed = time.perf_counter() - started
    await sub.unsubscribe()
    return elapsed


async def with_inbox(
    url: str, pg: str, table: str, stream: str, subject: str, n: int, batch: int, js: Any
) -> tuple[float, float]:
    """``NatsConsumer`` + ``AsyncInbox`` on PostgreSQL; seconds to ack ``n`` messages,
    and the client CPU seconds meanwhile."""
    if pg.startswith("postgres"):
        store = onceonly.open_async_store(
            pg, table=table, min_size=batch, max_size=batch, outbox_table=None
        )
    else:  # e.g. memory://: the consumer's own overhead, without PostgreSQL
        store = onceonly.open_async_store(pg)
    await store.migrate()
    inbox = onceonly.AsyncInbox(store, consumer="bench")
    handled = 0

    async def handler(payload: Any, tx: AsyncTx) -> None:
        nonlocal handled
        handled += 1

    consumer = NatsConsumer(
        inbox, handler, url=url, stream=stream, subject=subject, durable="onceonly", batch=batch
    )
    try:
        started, cpu = time.perf_counter(), time.process_time()
        async with consumer:
            while handled < n or not await acked_all(js, stream, "onceonly", n):
                await asyncio.sleep(0.005)
            elapsed = time.perf_counter() - started
            cpu = time.process_time() - cpu
    finally:
        await store.close()
    assert handled == n, (handled, n)
    return elapsed, cpu


def drop_table(pg: str, table: str) -> None:
    with psycopg.connect(pg, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")  # a generated identifier
        if conn.execute("SELECT to_regclass('onceonly_schema')").fetchone()[0]:
            conn.execute("DELETE FROM onceonly_schema WHERE component = %s", (f"records:{table}",))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--url", default=DEFAULT_NATS, help="NATS URL")
    parser.add_argument("--pg", default=DEFAULT_PG, help="the inbox's store URL (PostgreSQL)")
    parser.add_argument("--batch", type=int, default=32, help="fetch size and concurrency")
    parser.add_argument("--in-flight", type=int, default=64, help="concurrent publishes")
    args = parser.parse_args()
    n = args.messages

    tag = secrets.token_hex(4)
    stream, subject, table = f"BENCH_{tag}", f"bench.{tag}.events", f"bench_nats_{tag}"
    nc = await nats.connect(args.url)
    js = nc.jetstream()
    await js.add_stream(name=stream, subjects=[subject, f"{subject}.warmup"])
    try:
        pub_s = await publish_all(args.url, subject, n, args.in_flight)
        bare_s = await bare(nc, stream, subject, n, args.batch)
        inbox_s, cpu_s = await with_inbox(
            args.url, args.pg, table, stream, subject, n, args.batch, js
        )
    finally:
        with contextlib.suppress(Exception):
            await js.delete_stream(stream)
            await js.delete_stream(f"{stream}_dead")
        await nc.close()
        if args.pg.startswith("postgres"):
            drop_table(args.pg, table)

    print(f"NATS JetStream {args.url}, inbox on {args.pg}; {n} messages, batch {args.batch}")
    confirmed = f"publisher (confirmed, {args.in_flight} in flight):"
    print(f"{confirmed:38}{n / pub_s:10.0f} msg/s  ({pub_s:.2f} s)")
    print(f"bare consumer (fetch + ack):          {n / bare_s:10.0f} msg/s  ({bare_s:.2f} s)")
    print(f"NatsConsumer + AsyncInbox (PG):       {n / inbox_s:10.0f} msg/s  ({inbox_s:.2f} s)")
    print(f"  client CPU per message:             {cpu_s / n * 1e6:10.0f} µs")
    print(f"ratio onceonly / bare:                {bare_s / inbox_s:10.2f}")


if __name__ == "__main__":
    asyncio.run(main())
