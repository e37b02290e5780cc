# SPDX-License-Identifier: MIT
"""Outbox relay throughput and end-to-end messages/s, per broker (RabbitMQ, NATS, Redis).

* **relay**: ``--messages`` outbox rows are inserted first (PostgreSQL); then one
  ``AsyncRelay`` (``--batch-size`` rows per batch, up to 64 publishes in flight, no
  LISTEN) drains them: each row is published, confirmed by the broker (publisher
  confirm, JetStream PubAck, XADD reply) and deleted. Timed from the first batch until
  the outbox is empty: rows/s.
* **end to end**: three processes like a deployment. A relay process
  (``AsyncRelay.run()``, LISTEN/NOTIFY) and a consumer process (the broker's consumer
  with an ``AsyncInbox`` on PostgreSQL; the handler inserts the event id into a ledger
  through ``tx.execute``) are started and ready; then this process (service A) writes
  ``--messages`` events, each an events row plus its outbox row in one transaction,
  ``--writers`` transactions at a time. Timed from the first insert until the ledger
  holds every event: messages/s. A's own insert rate is shown beside it, since the
  pipeline cannot go faster than A writes.

Queues, streams and tables have unique names and are deleted at the end.

    .venv/bin/python bench/relay_pipeline.py [--messages 5000] [--brokers rabbitmq,nats,redis]
        [--batch-size 200] [--writers 4] [--pg URL] [--amqp URL] [--nats URL] [--redis URL]

This is a benchmark, not a test: it prints numbers and exits 0 unless it fails.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
import secrets
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root, for tests/

import onceonly
from tests.e2e._common import CONSUMER, Names, cleanup_broker, prepare_broker
from tests.e2e._common import make_publisher as publisher

DEFAULT_PG = os.environ.get(
    "ONCEONLY_BENCH_PG",
    os.environ.get("ONCEONLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"),
)
DEFAULT_URLS = {
    "rabbitmq": os.environ.get("ONCEONLY_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/"),
    "nats": os.environ.get("ONCEONLY_TEST_NATS", "nats://127.0.0.1:4222"),
    "redis": os.environ.get("ONCEONLY_TEST_REDIS", "redis://127.0.0.1:6379/0"),
}
CONCURRENCY = 16  # consumer handlers at once (and its PostgreSQL pool)


# -- brokers: the end-to-end tests' helpers (tests/e2e/_common.py) -----------------------


def consumer(broker: str, url: str, names: Names, inbox: Any, handler: Any) -> Any:
    """The broker's consumer with default tuning (the tests' one redelivers fast)."""
    if broker == "rabbitmq":
        from onceonly.brokers.rabbitmq import RabbitMQConsumer

        return RabbitMQConsumer(inbox, handler, queue=names.topic, url=url, concurrency=CONCURRENCY)
    if broker == "nats":
        from onceonly.brokers.nats import NatsConsumer

        return NatsConsumer(
            inbox,
            handler,
            stream=names.nats_stream,
            subject=names.topic,
            durable=CONSUMER,
            url=url,
            batch=CONCURRENCY,
            poll_timeout=0.5,
        )
    from onceonly.brokers.redis_streams import RedisStreamsConsumer

    return RedisStreamsConsumer(
        inbox,
        handler,
        stream=names.topic,
        group=CONSUMER,  # the group prepare_broker() created
        url=url,
        count=CONCURRENCY,
        concurrency=CONCURRENCY,
        block_ms=500,
    )


# -- PostgreSQL -------------------------------------------------------------------------


async def prepare_tables(pg: str, names: Names) -> None:
    store = onceonly.open_async_store(pg, table=names.records, outbox_table=names.outbox)
    try:
        await store.migrate()
    finally:
        await store.close()
    async with await psycopg.AsyncConnection.connect(pg, autocommit=True) as conn:
        await conn.execute(f"CREATE TABLE {names.events} (event_id text PRIMARY KEY)")
        await conn.execute(f"CREATE TABLE {names.ledger} (event_id text NOT NULL)")


def drop_tables(pg: str, names: Names) -> None:
    with psycopg.connect(pg, autocommit=True) as conn:
        for table in (names.events, names.ledger, names.records, names.outbox):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"DROP FUNCTION IF EXISTS {names.outbox}_notify()")
        if conn.execute("SELECT to_regclass('onceonly_schema')").fetchone()[0]:  # type: ignore[index]
            conn.execute(
                "DELETE FROM onceonly_schema WHERE component = ANY(%s)",
                ([f"records:{names.records}", f"outbox:{names.outbox}"],),
            )


async def write_events(pg: str, names: Names, n: int, writers: int) -> None:
    """Service A: ``n`` events, each with its outbox row in one transaction."""
    store = onceonly.open_async_store(pg, table=names.records, outbox_table=names.outbox)
    outbox = onceonly.AsyncOutbox(store)
    ids = iter(range(n))

    async def writer() -> None:
        async with await psycopg.AsyncConnection.connect(pg, autocommit=True) as conn:
            for i in ids:
                event_id = f"evt-{i:06d}"
                async with conn.transaction():
                    await conn.execute(
                        f"INSERT INTO {names.events} (event_id) VALUES (%s)", (event_id,)
                    )
                    await outbox.publish(conn, names.topic, {"event_id": event_id})

    try:
        await asyncio.gather(*(writer() for _ in range(writers)))
    finally:
        await store.close()


async def count(conn: psycopg.AsyncConnection[Any], table: str) -> int:
    cur = await conn.execute(f"SELECT count(*) FROM {table}")
    row = await cur.fetchone()
    return int(row[0]) if row else 0


# -- the relay alone --------------------------------------------------------------------


async def relay_throughput(args: argparse.Namespace, broker: str, url: str) -> float:
    names = Names(f"bench_relay_{os.getpid()}_{secrets.token_hex(3)}")
    try:
        await prepare_tables(args.pg, names)
        await prepare_broker(broker, url, names)
        store = onceonly.open_async_store(args.pg, table=names.records, outbox_table=names.outbox)
        outbox = onceonly.AsyncOutbox(store)
        async with store.transaction() as session:  # the rows, in one go
            for i in range(args.messages):
                message = outbox.prepare(names.topic, {"event_id": f"evt-{i:06d}"})
                await outbox.write(session, message)
        pub = publisher(broker, url)
        relay = onceonly.AsyncRelay(store, pub, batch_size=args.batch_size, listen=False)
        try:
            await pub.publish(  # connect before the clock starts
                onceonly.OutboxMessage(onceonly.uuid7(), names.topic, '{"warm": true}')
            )
            start = time.perf_counter()
            while relay.stats.published < args.messages:
                stats = await relay.run_once()
                if stats.failed or stats.dead:
                    raise RuntimeError(f"{stats.failed + stats.dead} publishes failed")
            elapsed = time.perf_counter() - start
        finally:
            await pub.close()
            await store.close()
        return args.messages / elapsed
    finally:
        await cleanup_broker(broker, url, names)
        drop_tables(args.pg, names)


# -- end to end -------------------------------------------------------------------------


def run_relay(
    pg: str, broker: str, url: str, prefix: str, batch: int, ready: Any, stop: Any
) -> None:
    """The relay process."""

    async def main() -> None:
        names = Names(prefix)
        store = onceonly.open_async_store(pg, table=names.records, outbox_table=names.outbox)
        pub = publisher(broker, url)
        relay = onceonly.AsyncRelay(store, pub, batch_size=batch, poll_interval=0.2)
        task = asyncio.ensure_future(relay.run())
        ready.set()
        while not stop.is_set() and not task.done():
            await asyncio.sleep(0.05)
        relay.stop()
        await task
        await pub.close()
        await store.close()

    asyncio.run(main())


def run_consumer(pg: str, broker: str, url: str, prefix: str, ready: Any, stop: Any) -> None:
    """Service B's process."""

    async def main() -> None:
        names = Names(prefix)
        store = onceonly.open_async_store(
            pg, table=names.records, outbox_table=names.outbox, max_size=CONCURRENCY
        )
        inbox = onceonly.AsyncInbox(store, consumer="bench")

        async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
            await tx.execute(
                f"INSERT INTO {names.ledger} (event_id) VALUES (?)", (payload["event_id"],)
            )

        async with consumer(broker, url, names, inbox, handler):
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
        await store.close()

    asyncio.run(main())


async def end_to_end(args: argparse.Namespace, broker: str, url: str) -> tuple[float, float]:
    """Returns (end-to-end messages/s, A's insert rate)."""
    names = Names(f"bench_e2e_{os.getpid()}_{secrets.token_hex(3)}")
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs: list[Any] = []
    try:
        await prepare_tables(args.pg, names)
        await prepare_broker(broker, url, names)
        readies = [ctx.Event(), ctx.Event()]
        procs = [
            ctx.Process(
                target=run_relay,
                args=(args.pg, broker, url, names.prefix, args.batch_size, readies[0], stop),
            ),
            ctx.Process(
                target=run_consumer, args=(args.pg, broker, url, names.prefix, readies[1], stop)
            ),
        ]
        for proc in procs:
            proc.start()
        for event in readies:
            if not await asyncio.to_thread(event.wait, 60):
                raise RuntimeError("a helper process did not start")
        await asyncio.sleep(0.5)  # let the consumer subscribe

        start = time.perf_counter()
        writing = asyncio.ensure_future(write_events(args.pg, names, args.messages, args.writers))
        async with await psycopg.AsyncConnection.connect(args.pg, autocommit=True) as conn:
            written_at = None
            deadline = time.monotonic() + 600
            while await count(conn, names.ledger) < args.messages:
                if writing.done() and written_at is None:
                    writing.result()
                    written_at = time.perf_counter()
                if not all(p.is_alive() for p in procs):
                    raise RuntimeError("a helper process died")
                if time.monotonic() > deadline:
                    raise RuntimeError("the pipeline did not deliver everything in 10 minutes")
                await asyncio.sleep(0.01)
            elapsed = time.perf_counter() - start
            await writing
            written_at = written_at or time.perf_counter()
            if await count(conn, names.ledger) != args.messages:
                raise RuntimeError("the ledger does not hold each event once")
        return args.messages / elapsed, args.messages / (written_at - start)
    finally:
        stop.set()
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()
        await cleanup_broker(broker, url, names)
        drop_tables(args.pg, names)


async def main_async(args: argparse.Namespace) -> None:
    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    urls = {"rabbitmq": args.amqp, "nats": args.nats, "redis": args.redis}
    print(f"# {shlex.join(sys.orig_argv)}")
    print(
        f"# {args.messages} messages, relay batch {args.batch_size}, A writers {args.writers},"
        f" consumer concurrency {CONCURRENCY}; {os.cpu_count()} CPUs,"
        f" Python {platform.python_version()}"
    )
    header = f"{'broker':<10}{'relay rows/s':>14}{'e2e msg/s':>12}{'A inserts/s':>14}"
    print(header)
    print("-" * len(header))
    for broker in brokers:
        if broker not in urls:
            raise SystemExit(f"unknown broker {broker!r}: rabbitmq, nats, redis")
        relay_rate = await relay_throughput(args, broker, urls[broker])
        e2e_rate, insert_rate = await end_to_end(args, broker, urls[broker])
        print(f"{broker:<10}{relay_rate:>14,.0f}{e2e_rate:>12,.0f}{insert_rate:>14,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--brokers", default="rabbitmq,nats,redis")
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--writers", type=int, default=4, help="A's concurrent transactions")
    parser.add_argument("--pg", default=DEFAULT_PG)
    parser.add_argument("--amqp", default=DEFAULT_URLS["rabbitmq"])
    parser.add_argument("--nats", default=DEFAULT_URLS["nats"])
    parser.add_argument("--redis", default=DEFAULT_URLS["redis"])
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
