# SPDX-License-Identifier: MIT
"""Throughput of ``RedisStreamsConsumer`` against a bare consumer, and of the publisher.

* **publisher**: ``RedisStreamsPublisher.publish`` (one XADD, returning once Redis
  replied) for ``--messages`` messages, ``--inflight`` (default 64) at a time.
* **onceonly consumer**: ``RedisStreamsConsumer`` with an ``AsyncInbox`` on PostgreSQL
  (``open_async_store(url, table=<fresh>)``, pool of ``--concurrency`` connections);
  the handler does nothing but return. Per entry: the inbox's claim + completion
  transaction, then XACK.
* **bare consumer**: the same stream read by another consumer group with
  ``XREADGROUP COUNT <concurrency>`` and one XACK per entry (gathered): the ceiling of a
  Redis Streams consumer that does no work.
* **inbox alone**, for reference: ``inbox.process`` on as many new keys, as many at a
  time, with no broker: the ceiling the store sets for the onceonly consumer.

The ``--messages`` entries are published first (the publisher run); each consumer then
reads all of them through a fresh group, timed from start until the group has
delivered and acknowledged every entry. Both consumers are warmed up first on a
separate stream. Each measurement runs ``--repeat`` times; the medians are shown.
Streams and tables are deleted at the end.

    .venv/bin/python bench/consumer_redis_streams.py [--messages 5000] [--url redis://...]
        [--pg postgresql://...] [--concurrency 64] [--inflight 64] [--repeat 3]

This is a benchmark, not a test: it prints numbers and exits 0 unless it fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import statistics
import time
from typing import Any

import psycopg
import redis.asyncio

import onceonly
from onceonly.brokers.redis_streams import RedisStreamsConsumer, RedisStreamsPublisher
from onceonly.messaging import OutboxMessage

DEFAULT_URL = os.environ.get("ONCEONLY_BENCH_REDIS", "redis://127.0.0.1:6379/0")
DEFAULT_PG = os.environ.get(
    "ONCEONLY_BENCH_PG",
    os.environ.get("ONCEONLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"),
)
WARMUP = 500


def _message(i: int, stream: str) -> OutboxMessage:
    mid = f"{secrets.token_hex(8)}-{i}"
    return OutboxMessage(id=mid, topic=stream, payload=json.dumps({"n": i, "id": mid}))


class Timed:
    """Wall-clock and this process's CPU seconds of a block."""

    def __enter__(self) -> Timed:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


async def publish(url: str, stream: str, n: int, inflight: int) -> Timed:
    """Publish ``n`` messages, ``inflight`` at a time; return the time taken."""
    messages = [_message(i, stream) for i in range(n)]
    queue: asyncio.Queue[OutboxMessage] = asyncio.Queue()
    for m in messages:
        queue.put_nowait(m)
    pub = RedisStreamsPublisher(url, max_connections=inflight)

    async def worker() -> None:
        while not queue.empty():
            await pub.publish(queue.get_nowait())

    with Timed() as t:
        await asyncio.gather(*(worker() for _ in range(inflight)))
    await pub.close()
    return t


async def _drained(r: redis.asyncio.Redis, stream: str, group: str, last: bytes) -> bool:
    for g in await r.xinfo_groups(stream):
        if g["name"] == group.encode():
            return bool(g["last-delivered-id"] == last and g["pending"] == 0)
    return False


async def _wait_drained(r: redis.asyncio.Redis, stream: str, group: str) -> None:
    [(last, _)] = await r.xrevrange(stream, count=1)
    while not await _drained(r, stream, group, last):
        await asyncio.sleep(0.005)


async def run_onceonly(
    r: redis.asyncio.Redis, store: Any, stream: str, scope: str, concurrency: int
) -> Timed:
    """Consume the whole stream through a fresh group and inbox scope; seconds taken."""
    inbox = onceonly.AsyncInbox(store, consumer=scope)

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        return None

    group = f"g-{scope}"
    consumer = RedisStreamsConsumer(
        inbox,
        handler,
        connection=r,
        stream=stream,
        group=group,
        consumer_name="bench",
        concurrency=concurrency,
        count=concurrency,
        block_ms=100,
    )
    with Timed() as t:
        async with consumer:
            await _wait_drained(r, stream, group)
    return t


async def run_bare(r: redis.asyncio.Redis, stream: str, group: str, concurrency: int) -> Timed:
    """XREADGROUP in batches and XACK each entry; seconds until the group is drained."""
    [(last, _)] = await r.xrevrange(stream, count=1)
    with Timed() as t:
        await r.xgroup_create(stream, group, id="0")
        done = False
        while not done:
            reply = await r.xreadgroup(group, "bare", {stream: ">"}, count=concurrency, block=100)
            for _, entries in reply or ():
                await asyncio.gather(*(r.xack(stream, group, eid) for eid, _ in entries))
                done = done or any(eid == last for eid, _ in entries)
    return t


async def run_inbox_alone(store: Any, scope: str, n: int, concurrency: int) -> Timed:
    """``inbox.process`` on ``n`` new keys, ``concurrency`` at a time, with no broker."""
    inbox = onceonly.AsyncInbox(store, consumer=scope)

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        return None

    keys = [f"{scope}-{i}" for i in range(n)]

    async def worker() -> None:
        while keys:
            key = keys.pop()
            await inbox.process(key, {"n": 0, "id": key}, handler)

    with Timed() as t:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return t


def _drop_tables(pg: str, table: str) -> None:
    with psycopg.connect(pg, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        if conn.execute("SELECT to_regclass('onceonly_schema')").fetchone()[0]:  # type: ignore[index]
            conn.execute("DELETE FROM onceonly_schema WHERE component = %s", (f"records:{table}",))


async def main(args: argparse.Namespace) -> None:
    n, conc = args.messages, args.concurrency
    tag = f"{os.getpid()}_{secrets.token_hex(3)}"
    stream, warm = f"bench:{tag}:in", f"bench:{tag}:warm"
    table = f"bench_records_{tag}"
    r = redis.asyncio.Redis.from_url(args.url, max_connections=max(conc, args.inflight) + 8)
    store = onceonly.open_async_store(
        args.pg, table=table, outbox_table=None, min_size=conc, max_size=conc
    )
    try:
        await store.migrate()
        # warm up: connections to Redis and PostgreSQL, code paths
        await publish(args.url, warm, WARMUP, args.inflight)
        await run_onceonly(r, store, warm, "warm", conc)
        await run_bare(r, warm, "g-warm-bare", conc)

        pub_times = []
        for _ in range(args.repeat):
            await r.delete(stream)
            pub_times.append(await publish(args.url, stream, n, args.inflight))
        ours, bare, alone = [], [], []
        for i in range(args.repeat):
            bare.append(await run_bare(r, stream, f"g-bare-{i}", conc))
            ours.append(await run_onceonly(r, store, stream, f"run{i}", conc))
            alone.append(await run_inbox_alone(store, f"alone{i}", n, conc))
    finally:
        await r.delete(stream, warm)
        await r.aclose()
        await store.close()
        _drop_tables(args.pg, table)

    def rate(times: list[Timed]) -> float:
        return n / statistics.median(t.wall for t in times)

    def cpu(times: list[Timed]) -> float:
        return statistics.median(t.cpu for t in times) / n * 1e6

    print(
        f"# Redis Streams, {n} messages, median of {args.repeat}; "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
    )
    print(f"# redis {args.url}, inbox on {args.pg} (pool {conc})")
    print(f"{'':56} {'msg/s':>8} {'client CPU µs/msg':>18}")
    rows = [
        (f"publisher (XADD confirmed, {args.inflight} in flight)", pub_times),
        (f"bare consumer (XREADGROUP COUNT {conc} + XACK each)", bare),
        (f"onceonly consumer (inbox on PostgreSQL, {conc} handlers)", ours),
        (f"  for reference: inbox.process alone, {conc} at a time", alone),
    ]
    for label, times in rows:
        print(f"{label:56} {rate(times):8.0f} {cpu(times):18.0f}")
    print(f"ratio onceonly / bare (msg/s): {rate(ours) / rate(bare):.2f}")
    print(f"ratio onceonly / inbox alone (msg/s): {rate(ours) / rate(alone):.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--url", default=DEFAULT_URL, help="Redis URL")
    parser.add_argument("--pg", default=DEFAULT_PG, help="PostgreSQL URL for the inbox")
    parser.add_argument("--concurrency", type=int, default=64, help="consumer handlers")
    parser.add_argument("--inflight", type=int, default=64, help="concurrent publishes")
    parser.add_argument("--repeat", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
