# SPDX-License-Identifier: MIT
"""Throughput of a broker consumer with ``batch_size=1`` against ``batch_size=32``.

``RedisStreamsConsumer`` with an ``AsyncInbox`` on PostgreSQL; the handler does one
business insert per message (``tx.execute``). With ``batch_size=1`` each delivery is
its own transaction (``inbox.process``); with ``batch_size=32`` the loop hands up to 32
received deliveries to one ``inbox.process_batch`` transaction and settles each by its
own outcome. Both run with the same number of deliveries in flight (``--inflight``).

The stream is filled once; each slice consumes ``--slice`` messages of it through a
fresh consumer group and inbox scope. The two cases alternate slice by slice (the order
flips every round) so both see the same load on this shared machine; the ratio is taken
per round and its median printed.

    .venv/bin/python bench/consumer_batch.py [--rounds 6] [--slice 2000]
        [--url redis://...] [--pg postgresql://...] [--inflight 64]

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
from onceonly.brokers.redis_streams import RedisStreamsConsumer

DEFAULT_URL = os.environ.get("ONCEONLY_BENCH_REDIS", "redis://127.0.0.1:6379/0")
DEFAULT_PG = os.environ.get(
    "ONCEONLY_BENCH_PG",
    os.environ.get("ONCEONLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"),
)


async def fill(r: redis.asyncio.Redis, stream: str, n: int) -> None:
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        mid = f"{secrets.token_hex(6)}-{i}"
        pipe.xadd(stream, {"payload": json.dumps({"n": i}), "headers": "{}", "id": mid})
    await pipe.execute()


async def consume(
    r: redis.asyncio.Redis,
    store: Any,
    stream: str,
    ledger: str,
    tag: str,
    batch: int,
    n: int,
    inflight: int,
) -> float:
    """Seconds to consume ``n`` entries through a fresh group (from the stream's start)."""
    inbox = onceonly.AsyncInbox(store, consumer=tag)
    done = asyncio.Event()
    count = 0
    insert = f"INSERT INTO {ledger} (id) VALUES (?)"

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        nonlocal count
        await tx.execute(insert, (f"{tag}:{tx.key}",))
        count += 1
        if count >= n:
            done.set()

    consumer = RedisStreamsConsumer(
        inbox,
        handler,
        connection=r,
        stream=stream,
        group=f"g-{tag}",
        consumer_name="bench",
        concurrency=inflight,
        count=inflight,
        block_ms=100,
        batch_size=batch,
        shutdown_timeout=5.0,
    )
    start = time.perf_counter()
    async with consumer:
        await asyncio.wait_for(done.wait(), 120)
        took = time.perf_counter() - start
    return took


async def inbox_alone(
    store: Any, ledger: str, tag: str, batch: int, n: int, inflight: int
) -> float:
    """Seconds for the inbox alone (no broker) on ``n`` new keys: ``process`` (batch 1) or
    ``process_batch`` in chunks of ``batch``, ``inflight`` messages at a time."""
    inbox = onceonly.AsyncInbox(store, consumer=tag)
    insert = f"INSERT INTO {ledger} (id) VALUES (?)"

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        await tx.execute(insert, (f"{tag}:{tx.key}",))

    chunks = [
        [(f"k{i}", {"n": i}) for i in range(j, min(j + batch, n))] for j in range(0, n, batch)
    ]

    async def worker() -> None:
        while chunks:
            chunk = chunks.pop()
            if batch == 1:
                await inbox.process(chunk[0][0], chunk[0][1], handler)
            else:
                await inbox.process_batch(chunk, handler)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(max(1, inflight // batch))))
    return time.perf_counter() - start


async def main(args: argparse.Namespace) -> None:
    tag = f"{os.getpid()}_{secrets.token_hex(3)}"
    stream, table, ledger = f"bench:{tag}:batch", f"bench_rec_{tag}", f"bench_ledger_{tag}"
    r = redis.asyncio.Redis.from_url(args.url, max_connections=args.inflight + 8)
    size = min(args.inflight, 32)
    store = onceonly.open_async_store(
        args.pg, table=table, outbox_table=None, min_size=size, max_size=size
    )
    with psycopg.connect(args.pg, autocommit=True) as admin:
        admin.execute(f"CREATE TABLE {ledger} (id text PRIMARY KEY)")
    rates: dict[int, list[float]] = {1: [], 32: []}
    alone: dict[int, list[float]] = {1: [], 32: []}
    ratios: list[float] = []
    try:
        await store.migrate()
        await fill(r, stream, args.slice)
        for batch in (1, 32):  # warm up both paths
            await consume(r, store, stream, ledger, f"warm{batch}", batch, 200, args.inflight)
        for rnd in range(args.rounds):
            order = (1, 32) if rnd % 2 == 0 else (32, 1)
            got: dict[int, float] = {}
            for batch in order:
                secs = await consume(
                    r, store, stream, ledger, f"r{rnd}b{batch}", batch, args.slice, args.inflight
                )
                got[batch] = args.slice / secs
                rates[batch].append(got[batch])
                secs = await inbox_alone(
                    store, ledger, f"a{rnd}b{batch}", batch, args.slice, args.inflight
                )
                alone[batch].append(args.slice / secs)
            ratios.append(got[32] / got[1])
            print(f"round {rnd}: batch 1 {got[1]:8.0f} msg/s   batch 32 {got[32]:8.0f} msg/s")
    finally:
        await r.delete(stream)
        await r.aclose()
        await store.close()
        with psycopg.connect(args.pg, autocommit=True) as admin:
            admin.execute(f"DROP TABLE IF EXISTS {ledger}")
            admin.execute(f"DROP TABLE IF EXISTS {table}")
            if admin.execute("SELECT to_regclass('onceonly_schema')").fetchone()[0]:  # type: ignore[index]
                admin.execute(
                    "DELETE FROM onceonly_schema WHERE component = %s", (f"records:{table}",)
                )
    print(
        f"# Redis Streams consumer, inbox on PostgreSQL (pool {size}), one insert per message,"
        f" {args.inflight} in flight; {args.rounds} rounds of {args.slice} messages per case,"
        f" interleaved; Python {platform.python_version()}, {os.cpu_count()} CPUs"
    )
    print(f"batch_size 1:  median {statistics.median(rates[1]):8.0f} msg/s")
    print(f"batch_size 32: median {statistics.median(rates[32]):8.0f} msg/s")
    for batch in (1, 32):
        call = "process" if batch == 1 else "process_batch"
        print(
            f"  for reference, inbox.{call} alone (no broker), batch {batch}:"
            f" median {statistics.median(alone[batch]):8.0f} msg/s"
        )
    print(f"ratio batch 32 / batch 1 (median of per-round ratios): {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--slice", type=int, default=2000)
    parser.add_argument("--url", default=DEFAULT_URL, help="Redis URL")
    parser.add_argument("--pg", default=DEFAULT_PG, help="PostgreSQL URL for the inbox")
    parser.add_argument("--inflight", type=int, default=64, help="deliveries in flight")
    asyncio.run(main(parser.parse_args()))
