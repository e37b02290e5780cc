# SPDX-License-Identifier: MIT
"""``@onceonly.idempotent`` (leased mode) on Redis vs PostgreSQL: calls/s and round trips.

A no-op function is protected on each store, and called

* with **new keys** (every call claims, runs, completes), and
* as **replays** (every key completed beforehand; every call returns the stored result),

by 1 and by 8 threads, each for ``--seconds``. Round trips per call are counted in a
separate, untimed pass: on Redis every command the client sends (``execute_command``,
one request and its reply: the scripts' ``EVALSHA``), on PostgreSQL the store operations
(one statement each; ``bench/leased_roundtrips.py`` checks that on the wire).

    .venv/bin/python bench/leased_redis.py [--redis URL] [--pg URL] [--seconds 2]

This is a benchmark, not a test: it prints numbers; its keys and tables are removed.
"""

from __future__ import annotations

import argparse
import itertools
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import onceonly

REDIS_URL = os.environ.get("ONCEONLY_TEST_REDIS", "redis://127.0.0.1:6379/0")
PG_URL = os.environ.get("ONCEONLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
REPLAY_KEYS = 2000
SESSION_METHODS = ("claim", "get", "insert", "update", "renew", "save_checkpoint")


def open_stores(redis_url: str, pg_url: str) -> tuple[dict[str, Any], Callable[[], None]]:
    tag = uuid.uuid4().hex[:10]
    rs = onceonly.open_store(redis_url, prefix=f"bench_{tag}:")
    pg = onceonly.open_store(pg_url, table=f"bench_{tag}", outbox_table=None, max_size=10)
    for s in (rs, pg):
        s.migrate()

    def cleanup() -> None:
        keys = list(rs.client.scan_iter(match=f"bench_{tag}:*", count=1000))
        for i in range(0, len(keys), 500):
            rs.client.delete(*keys[i : i + 500])
        rs.close()
        with pg.session() as s:
            s.connection.execute(f"DROP TABLE IF EXISTS bench_{tag}")
            s.connection.execute(
                "DELETE FROM onceonly_schema WHERE component = %s", (f"records:bench_{tag}",)
            )
        pg.close()

    return {"redis": rs, "postgres": pg}, cleanup


def noop_fn(store: Any) -> Callable[[str], int]:
    @onceonly.idempotent(store, key=lambda k: k, scope="bench.noop", lease=30, ttl=3600)
    def noop(k: str) -> int:
        return 1

    return noop


def rate(
    fn: Callable[[str], int], keys: Callable[[int], str], threads: int, seconds: float
) -> float:
    """Calls per second of ``fn`` by ``threads`` threads for ``seconds``."""
    counts = [0] * threads
    stop = threading.Event()
    barrier = threading.Barrier(threads + 1)

    def run(i: int) -> None:
        barrier.wait()
        n = 0
        while not stop.is_set():
            fn(keys(i))
            n += 1
        counts[i] = n

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    started = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    return sum(counts) / (time.perf_counter() - started)


def round_trips(kind: str, store: Any, fn: Callable[[str], int], key: str) -> int:
    """Round trips of one call of ``fn(key)`` (see the module docstring)."""
    sent = [0]
    if kind == "redis":
        client = store.client
        original = client.execute_command

        def counted(*args: Any, **options: Any) -> Any:
            sent[0] += 1
            return original(*args, **options)

        client.execute_command = counted
        try:
            fn(key)
        finally:
            del client.execute_command
        return sent[0]
    with store.session() as s:
        cls = type(s)
    originals = {n: getattr(cls, n) for n in SESSION_METHODS}

    def spy(name: str) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            sent[0] += 1
            return originals[name](self, *args, **kwargs)

        return wrapper

    try:
        for n in SESSION_METHODS:
            setattr(cls, n, spy(n))
        fn(key)
    finally:
        for n, f in originals.items():
            setattr(cls, n, f)
    return sent[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", default=REDIS_URL)
    parser.add_argument("--pg", default=PG_URL)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    stores, cleanup = open_stores(args.redis, args.pg)
    results: dict[tuple[str, str, int], float] = {}
    trips: dict[tuple[str, str], int] = {}
    try:
        for kind, store in stores.items():
            fn = noop_fn(store)
            fresh = itertools.count()
            trips[kind, "new"] = round_trips(kind, store, fn, f"rt-{kind}")
            trips[kind, "replay"] = round_trips(kind, store, fn, f"rt-{kind}")
            for i in range(REPLAY_KEYS):
                fn(f"replay-{i}")
            for threads in (1, 8):
                # itertools.count is safe to share between threads (a generator is not)
                results[kind, "new", threads] = rate(
                    fn, lambda i, c=fresh: f"new-{next(c)}", threads, args.seconds
                )
                cycle = itertools.count()
                results[kind, "replay", threads] = rate(
                    fn, lambda i, c=cycle: f"replay-{next(c) % REPLAY_KEYS}", threads, args.seconds
                )
    finally:
        cleanup()
    print(f"@idempotent no-op, {args.seconds:g} s per cell, sync threads")
    print(
        f"{'workload':<10} {'conc':>4} {'redis/s':>10} {'postgres/s':>11} {'ratio':>6}  trips r/pg"
    )
    for workload in ("new", "replay"):
        for threads in (1, 8):
            r, p = results["redis", workload, threads], results["postgres", workload, threads]
            print(
                f"{workload:<10} {'c' + str(threads):>4} {r:>10,.0f} {p:>11,.0f} {r / p:>5.2f}x"
                f"  {trips['redis', workload]}/{trips['postgres', workload]}"
            )


if __name__ == "__main__":
    main()
