# SPDX-License-Identifier: MIT
"""onceonly on Redis beside idemkit's Redis backend and AWS Lambda Powertools' Redis
persistence layer, protecting the same no-op function: calls/s and round trips.

The peers are installed in an environment of the bench's own, never in the project's::

    python -m venv .venv-peers
    .venv-peers/bin/pip install -e '.[redis]' idemkit 'aws-lambda-powertools[redis]'
    .venv-peers/bin/python bench/peers_redis.py [--seconds 3]

It starts a redis-server of its own on a free port (no other traffic, so nothing else
moves its numbers) and removes it at the end. Each library protects ``f(order_id) -> 1``;
**new keys** call it with an id never seen, **replays** with one already completed.
Concurrency 1 and 8: threads for the sync libraries, tasks for the async ones; the two
libraries of a pair alternate in 0.5 s slices (medians), so both see the same load. Pairs
are compared like for like: onceonly's async ``@idempotent`` on ``AsyncRedisStore``
against idemkit's async ``idempotent`` (``RedisBackend``), onceonly's sync decorator on
``RedisStore`` against Powertools' ``idempotent_function`` (sync only). Local caches are
off everywhere (``use_local_cache=False``).

Round trips are counted on the client: one per ``send_packed_command`` of a redis-py
connection (a pipeline's commands go in one), in a separate untimed pass of 200 calls.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.connection
import redis.connection

import onceonly

SENT = [0]


def _count(cls: Any, is_async: bool) -> None:
    """Count requests sent by every connection of ``cls`` (one per round trip)."""
    original = cls.send_packed_command
    if is_async:

        async def send_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            SENT[0] += 1
            return await original(self, *args, **kwargs)

        cls.send_packed_command = send_async
    else:

        def send(self: Any, *args: Any, **kwargs: Any) -> Any:
            SENT[0] += 1
            return original(self, *args, **kwargs)

        cls.send_packed_command = send


_count(redis.connection.AbstractConnection, False)
_count(redis.asyncio.connection.AbstractConnection, True)


def start_redis() -> tuple[subprocess.Popen[bytes], int, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    home = tempfile.mkdtemp(prefix="peers-redis-")
    binary = shutil.which("redis-server") or "redis-server"
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", home],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc, port, home
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def sync_rate(
    fn: Callable[[str], Any], keys: Callable[[], str], threads: int, secs: float
) -> float:
    counts = [0] * threads
    stop = threading.Event()
    barrier = threading.Barrier(threads + 1)

    def work(i: int) -> None:
        barrier.wait()
        n = 0
        while not stop.is_set():
            fn(keys())
            n += 1
        counts[i] = n

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    time.sleep(secs)
    stop.set()
    for t in pool:
        t.join()
    return sum(counts) / (time.perf_counter() - started)


async def async_rate(
    fn: Callable[[str], Awaitable[Any]], keys: Callable[[], str], tasks: int, secs: float
) -> float:
    counts = [0] * tasks
    deadline = time.perf_counter() + secs

    async def work(i: int) -> None:
        n = 0
        while time.perf_counter() < deadline:
            await fn(keys())
            n += 1
        counts[i] = n

    started = time.perf_counter()
    await asyncio.gather(*(work(i) for i in range(tasks)))
    return sum(counts) / (time.perf_counter() - started)


def trips_sync(
    fn: Callable[[str], Any], new: Callable[[], str], replay: str
) -> tuple[float, float]:
    SENT[0] = 0
    for _ in range(200):
        fn(new())
    per_new = SENT[0] / 200
    SENT[0] = 0
    for _ in range(200):
        fn(replay)
    return per_new, SENT[0] / 200


async def trips_async(
    fn: Callable[[str], Awaitable[Any]], new: Callable[[], str], replay: str
) -> tuple[float, float]:
    SENT[0] = 0
    for _ in range(200):
        await fn(new())
    per_new = SENT[0] / 200
    SENT[0] = 0
    for _ in range(200):
        await fn(replay)
    return per_new, SENT[0] / 200


def onceonly_sync(url: str) -> Callable[[str], Any]:
    store = onceonly.open_store(url, prefix="oo:")

    @onceonly.idempotent(store, key=lambda order_id: order_id, scope="bench.f", ttl=3600)
    def f(order_id: str) -> int:
        return 1

    return f


def powertools_sync(port: int) -> Callable[[str], Any]:
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
    )

    layer = RedisCachePersistenceLayer(client=redis.Redis(port=port))
    config = IdempotencyConfig(expires_after_seconds=3600, use_local_cache=False)

    @idempotent_function(data_keyword_argument="order", persistence_store=layer, config=config)
    def f(order: dict[str, str]) -> int:
        return 1

    return lambda order_id: f(order={"id": order_id})


def onceonly_async(url: str) -> Callable[[str], Awaitable[Any]]:
    store = onceonly.open_async_store(url, prefix="ooa:")

    @onceonly.idempotent(store, key=lambda order_id: order_id, scope="bench.f", ttl=3600)
    async def f(order_id: str) -> int:
        return 1

    return f


def idemkit_async(port: int) -> Callable[[str], Awaitable[Any]]:
    import idemkit

    backend = idemkit.RedisBackend(redis.asyncio.Redis(port=port), namespace="ik")
    config = idemkit.MethodConfig(expires_after_seconds=3600, use_local_cache=False)

    @idemkit.idempotent(backend=backend, config=config)
    async def f(order_id: str) -> int:
        return 1

    return f


SLICE = 0.5  # seconds: the two libraries of a pair alternate in slices this long


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per library and cell")
    args = parser.parse_args()
    slices = max(1, round(args.seconds / SLICE))
    proc, port, home = start_redis()
    url = f"redis://127.0.0.1:{port}/0"
    fresh = itertools.count()
    rate: dict[tuple[str, str, int], float] = {}
    trips: dict[str, tuple[float, float]] = {}

    def new_key() -> str:
        return f"n-{next(fresh)}"

    def replay_key() -> str:
        return "replay-key"

    try:
        pair = {"onceonly sync": onceonly_sync(url), "powertools": powertools_sync(port)}
        for name, fn in pair.items():
            fn("replay-key")
            trips[name] = trips_sync(fn, new_key, "replay-key")
        for workload, keys in (("new", new_key), ("replay", replay_key)):
            for threads in (1, 8):
                got: dict[str, list[float]] = {name: [] for name in pair}
                for _ in range(slices):  # alternate, so both see the same machine load
                    for name, fn in pair.items():
                        got[name].append(sync_rate(fn, keys, threads, SLICE))
                for name in pair:
                    rate[name, workload, threads] = statistics.median(got[name])

        async def run_async() -> None:
            apair = {"onceonly async": onceonly_async(url), "idemkit": idemkit_async(port)}
            for name, fn in apair.items():
                await fn("replay-key")
                trips[name] = await trips_async(fn, new_key, "replay-key")
            for workload, keys in (("new", new_key), ("replay", replay_key)):
                for tasks in (1, 8):
                    got: dict[str, list[float]] = {name: [] for name in apair}
                    for _ in range(slices):
                        for name, fn in apair.items():
                            got[name].append(await async_rate(fn, keys, tasks, SLICE))
                    for name in apair:
                        rate[name, workload, tasks] = statistics.median(got[name])

        asyncio.run(run_async())
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(home, ignore_errors=True)
    print(f"no-op function on a private Redis; calls/s, median of {slices} slices of {SLICE} s")
    print(
        f"{'library':<16} {'new c1':>8} {'new c8':>8} {'replay c1':>10} {'replay c8':>10}"
        "  round trips new/replay"
    )
    for name in ("onceonly sync", "powertools", "onceonly async", "idemkit"):
        cells = [rate[name, w, c] for w in ("new", "replay") for c in (1, 8)]
        print(
            f"{name:<16} {cells[0]:>8,.0f} {cells[1]:>8,.0f} {cells[2]:>10,.0f} "
            f"{cells[3]:>10,.0f}  {trips[name][0]:.1f} / {trips[name][1]:.1f}"
        )
    for ours, peer in (("onceonly sync", "powertools"), ("onceonly async", "idemkit")):
        ratios = [rate[ours, w, c] / rate[peer, w, c] for w in ("new", "replay") for c in (1, 8)]
        print(
            f"{ours} / {peer}: "
            + ", ".join(f"{r:.2f}x" for r in ratios)
            + "  (new c1, new c8, replay c1, replay c8)"
        )


if __name__ == "__main__":
    main()
