# SPDX-License-Identifier: MIT
"""Throughput of ``KafkaConsumer`` against a hand-written confluent-kafka consumer, both
writing each record to PostgreSQL, at ``batch_size`` 1 and 100 (interleaved runs).

* **onceonly**: ``KafkaConsumer`` with an ``AsyncInbox`` on PostgreSQL, offsets in the
  store (``offsets="store"``: the position row written in the handler's transaction);
  the handler inserts the record's id into a ledger table.
* **hand-written**: a confluent-kafka ``Consumer`` polling ``consume(batch)``, inserting
  the batch's ids in one PostgreSQL transaction (``executemany``), then committing the
  Kafka offsets (synchronously) after each batch. No dedup, no ordering by key, no
  dead letters: the floor of "insert and commit".

Each run gets a fresh topic (``--partitions``) holding ``--messages`` keyed records and a
fresh group, and is timed from the first record handled to the last (the group join,
seconds on Tansu, is left out). Runs alternate between the two consumers ``--repeat``
times per batch size; medians are shown with the ratio onceonly / hand-written.

The broker is Tansu 0.6.0 (a Kafka-compatible broker, not Apache Kafka; memory storage):
``scripts/services kafka``.

    .venv/bin/python bench/consumer_kafka.py [--messages 3000] [--repeat 3]
        [--concurrency N] [--bootstrap 127.0.0.1:9092] [--pg postgresql://postgres@127.0.0.1:5432/postgres]

This is a benchmark, not a test: it prints numbers and exits 0 unless it fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from typing import Any

import psycopg
from confluent_kafka import Consumer, Producer

import onceonly
from onceonly.brokers.kafka import KafkaConsumer
from onceonly.brokers.kafka._wire import ensure_topics

FAST_JOIN = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}


def fill(bootstrap: str, topic: str, n: int, partitions: int) -> None:
    ensure_topics({"bootstrap.servers": bootstrap}, [(topic, partitions)])
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        p.produce(
            topic,
            key=f"k{i}".encode(),
            value=json.dumps({"id": f"r{i}"}).encode(),
            headers=[("onceonly-message-id", f"r{i}".encode())],
        )
        if i % 1000 == 0:
            p.poll(0)
    p.flush(30)


async def run_onceonly(args: argparse.Namespace, topic: str, batch: int) -> float:
    table = f"bench_{uuid.uuid4().hex[:10]}"
    store = onceonly.open_async_store(args.pg, table=table, outbox_table=None)
    await store.migrate()
    async with store.transaction() as tx:
        await tx.execute(f"CREATE TABLE {table}_ledger (id TEXT NOT NULL)")
    first: list[float] = []
    done = asyncio.Event()
    count = 0

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        nonlocal count
        if not first:
            first.append(time.perf_counter())
        await tx.execute(f"INSERT INTO {table}_ledger (id) VALUES (?)", (payload["id"],))
        count += 1
        if count >= args.messages:
            done.set()

    inbox = onceonly.AsyncInbox(store, consumer="bench")
    consumer = KafkaConsumer(
        inbox,
        handler,
        topics=[topic],
        group=f"g-{uuid.uuid4().hex[:8]}",
        bootstrap=args.bootstrap,
        config=FAST_JOIN,
        positions_table=f"{table}_pos",
        batch_size=batch,
        batch_wait=0.005,
        concurrency=args.concurrency or max(16, batch),
    )
    async with consumer:
        await asyncio.wait_for(done.wait(), 300)
        elapsed = time.perf_counter() - first[0]
    await store.close()
    with psycopg.connect(args.pg, autocommit=True) as conn:
        for t in (table, f"{table}_ledger", f"{table}_pos"):
            conn.execute(f"DROP TABLE IF EXISTS {t}")
    return args.messages / elapsed


def run_hand_written(args: argparse.Namespace, topic: str, batch: int) -> float:
    table = f"bench_{uuid.uuid4().hex[:10]}_ledger"
    conn = psycopg.connect(args.pg)
    conn.execute(f"CREATE TABLE {table} (id TEXT NOT NULL)")
    conn.commit()
    c = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **FAST_JOIN,
        }
    )
    c.subscribe([topic])
    seen = 0
    start = 0.0
    while seen < args.messages:
        msgs = [m for m in c.consume(batch, 1.0) if m.error() is None]
        if not msgs:
            continue
        if not start:
            start = time.perf_counter()
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {table} (id) VALUES (%s)",
                [(json.loads(m.value())["id"],) for m in msgs],
            )
        conn.commit()
        c.commit(asynchronous=False)
        seen += len(msgs)
    elapsed = time.perf_counter() - start
    c.close()
    conn.execute(f"DROP TABLE {table}")
    conn.commit()
    conn.close()
    return args.messages / elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument(
        "--concurrency",
        type=int,
        default=0,
        help="KafkaConsumer concurrency (default max(16, batch size): one batch at a time)",
    )
    ap.add_argument("--bootstrap", default=os.environ.get("ONCEONLY_TEST_KAFKA", "127.0.0.1:9092"))
    ap.add_argument(
        "--pg",
        default=os.environ.get("ONCEONLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    args = ap.parse_args()
    print(
        f"Kafka consumer benchmark on Tansu; {args.messages} records, {args.partitions} partitions"
    )
    for batch in (1, 100):
        ours: list[float] = []
        theirs: list[float] = []
        for _ in range(args.repeat):
            for who in ("hand", "onceonly"):
                topic = f"bench-{uuid.uuid4().hex[:10]}"
                fill(args.bootstrap, topic, args.messages, args.partitions)
                if who == "hand":
                    theirs.append(run_hand_written(args, topic, batch))
                else:
                    ours.append(asyncio.run(run_onceonly(args, topic, batch)))
        a, b = statistics.median(ours), statistics.median(theirs)
        print(
            f"batch_size {batch:>3}: onceonly {a:8.0f} msg/s   hand-written {b:8.0f} msg/s"
            f"   ratio {a / b:.2f}   (runs: {[round(x) for x in ours]}"
            f" vs {[round(x) for x in theirs]})"
        )


if __name__ == "__main__":
    main()
