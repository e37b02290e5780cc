# SPDX-License-Identifier: MIT
"""Cache tiers in front of PostgreSQL: replays from the local tier, and an inbox on a
70 %-duplicate workload with and without tiers.

1. ``@idempotent`` replays of one completed key answered by the local tier (no round
   trip), by 1 thread: calls/s, against the same replays answered by PostgreSQL.
2. ``Inbox.process`` on PostgreSQL (atomic mode: the claim, one ledger insert and the
   completion in one transaction) on a stream where 70 % of the deliveries repeat an
   earlier message id, then on one where every key is new (the Redis tier's lookup that
   misses is then pure cost: what a Bloom pre-check could save at most), by 1 and 8
   threads, for three stores (alternating in 0.5 s slices; medians): PostgreSQL alone; with a
   Redis tier only (what a fleet of processes shares); with a local tier and a Redis
   tier. Per delivery: PostgreSQL store operations and Redis commands, counted in a
   separate untimed pass of the same stream.

    .venv/bin/python bench/tiers.py [--pg URL] [--redis URL] [--seconds 2]

This is a benchmark, not a test: it prints numbers; its tables and keys are removed.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import onceonly
from onceonly.stores.tiered import LocalTier, RedisTier, TieredStore

PG_URL = os.environ.get("ONCEONLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("ONCEONLY_TEST_REDIS", "redis://127.0.0.1:6379/0")
DUPLICATES = (0.7, 0.0)  # the second: every key new, what a Bloom pre-check could save
OPS = ("claim", "get", "update", "insert")
SLICE = 0.5  # seconds: the stores alternate in slices this long (medians)


class Stream:
    """Message ids where each delivery repeats an earlier id with probability
    ``duplicates``."""

    def __init__(self, tag: str, duplicates: float, seed: int = 1) -> None:
        self.tag, self.rng, self.seen = tag, random.Random(seed), 0
        self.duplicates = duplicates
        self.lock = threading.Lock()

    def next(self) -> str:
        with self.lock:
            if self.seen and self.rng.random() < self.duplicates:
                return f"{self.tag}-{self.rng.randrange(self.seen)}"
            self.seen += 1
            return f"{self.tag}-{self.seen - 1}"


def run_for(fn: Callable[[], None], threads: int, seconds: float) -> float:
    """Calls/s of ``fn`` by ``threads`` threads for ``seconds``."""
    counts = [0] * threads
    stop = threading.Event()
    barrier = threading.Barrier(threads + 1)

    def work(i: int) -> None:
        barrier.wait()
        n = 0
        while not stop.is_set():
            fn()
            n += 1
        counts[i] = n

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in pool:
        t.join()
    return sum(counts) / (time.perf_counter() - started)


def count_ops(store: Any, redis_client: Any, fn: Callable[[], None], n: int) -> tuple[float, float]:
    """PostgreSQL store operations and Redis commands per call of ``fn`` (n calls)."""
    pg_ops, redis_ops = [0], [0]
    with store.durable.session() if isinstance(store, TieredStore) else store.session() as s:
        cls = type(s)
    originals = {name: getattr(cls, name) for name in OPS}

    def spy(name: str) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            pg_ops[0] += 1
            return originals[name](self, *args, **kwargs)

        return wrapper

    send = redis_client.execute_command

    def counted(*args: Any, **options: Any) -> Any:
        redis_ops[0] += 1
        return send(*args, **options)

    redis_client.execute_command = counted
    try:
        for name in OPS:
            setattr(cls, name, spy(name))
        for _ in range(n):
            fn()
    finally:
        for name, f in originals.items():
            setattr(cls, name, f)
        del redis_client.execute_command
    return pg_ops[0] / n, redis_ops[0] / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg", default=PG_URL)
    parser.add_argument("--redis", default=REDIS_URL)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:10]
    pg = onceonly.open_store(args.pg, table=f"tiers_{tag}", outbox_table=None, max_size=10)
    pg.migrate()
    cache = onceonly.open_store(args.redis, prefix=f"tiers_{tag}:")
    ledger = f"tiers_{tag}_ledger"
    with pg.transaction() as s:
        s.execute(f"CREATE TABLE {ledger} (id TEXT NOT NULL, amount INTEGER)")
    try:
        # 1. replays from the local tier vs from PostgreSQL
        print("@idempotent replays of one completed key, 1 thread")
        for name, store in (
            ("postgres", pg),
            ("local tier", TieredStore(pg, local=LocalTier(10_000, 60))),
        ):

            @onceonly.idempotent(store, key=lambda k: k, scope=f"replay-{name}", ttl=3600)
            def noop(k: str) -> int:
                return 1

            noop("k")
            rate = run_for(lambda fn=noop: fn("k"), 1, args.seconds)  # type: ignore[misc]
            print(f"  {name:<12} {rate:>10,.0f} replays/s")

        # 2. the inbox on a 70 %-duplicate stream, then on new keys only
        def handler(msg: dict[str, Any], tx: Any) -> str:
            tx.execute(f"INSERT INTO {ledger} (id, amount) VALUES (?, ?)", (msg["id"], 1))
            return "ok"

        configs: list[tuple[str, Callable[[], Any]]] = [
            ("postgres", lambda: pg),
            ("redis tier", lambda: TieredStore(pg, redis=RedisTier(cache, ttl=600))),
            (
                "local + redis tiers",
                lambda: TieredStore(
                    pg, local=LocalTier(100_000, 60), redis=RedisTier(cache, ttl=600)
                ),
            ),
        ]
        slices = max(1, round(args.seconds / SLICE))
        for dup in DUPLICATES:
            print(f"\nInbox on PostgreSQL, {dup:.0%} duplicates, one ledger insert per run")
            print(f"  {'store':<22} {'c1 msg/s':>9} {'c8 msg/s':>9}  pg ops  redis cmds  (per msg)")
            inboxes = [
                onceonly.Inbox(make(), consumer=f"bench{i}-{dup}", wait=10)
                for i, (_, make) in enumerate(configs)
            ]
            rates: dict[tuple[int, int], list[float]] = {}
            for threads in (1, 8):
                streams = [Stream(f"{i}-{threads}-{dup}", dup) for i in range(len(configs))]

                def deliver(inbox: Any, stream: Stream) -> None:
                    key = stream.next()
                    inbox.process(key, {"id": key}, handler)

                for inbox, stream in zip(inboxes, streams, strict=True):
                    for _ in range(300):  # warm: earlier ids to repeat
                        deliver(inbox, stream)
                for _ in range(slices):  # alternate, so all see the same machine load
                    for i, (inbox, stream) in enumerate(zip(inboxes, streams, strict=True)):
                        rates.setdefault((i, threads), []).append(
                            run_for(lambda ib=inbox, st=stream: deliver(ib, st), threads, SLICE)
                        )
            for i, (name, _) in enumerate(configs):
                inbox = inboxes[i]
                stream = Stream(f"{i}-count-{dup}", dup)
                counted = Counter[str]()

                def deliver_counted(
                    inbox: Any = inbox, stream: Stream = stream, counted: Counter[str] = counted
                ) -> None:
                    key = stream.next()
                    replayed = inbox.process(key, {"id": key}, handler).replayed
                    counted["replayed" if replayed else "run"] += 1

                tier = getattr(inbox.store, "redis", None)  # the Redis tier has its own client
                client = cache.client if tier is None else tier.client
                pg_ops, redis_ops = count_ops(inbox.store, client, deliver_counted, 2000)
                c1 = statistics.median(rates[i, 1])
                c8 = statistics.median(rates[i, 8])
                print(
                    f"  {name:<22} {c1:>9,.0f} {c8:>9,.0f}  {pg_ops:>6.2f}"
                    f"  {redis_ops:>10.2f}  ({counted['replayed'] / 2000:.0%} replayed)"
                )
    finally:
        with pg.transaction() as s:
            s.execute(f"DROP TABLE IF EXISTS {ledger}")
            s.execute(f"DROP TABLE IF EXISTS tiers_{tag}")
            s.execute("DELETE FROM onceonly_schema WHERE component = ?", (f"records:tiers_{tag}",))
        keys = list(cache.client.scan_iter(match=f"tiers_{tag}:*", count=1000))
        for i in range(0, len(keys), 500):
            cache.client.delete(*keys[i : i + 500])
        cache.close()
        pg.close()


if __name__ == "__main__":
    main()
