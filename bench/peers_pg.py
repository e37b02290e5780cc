# SPDX-License-Identifier: MIT
"""Leased mode on PostgreSQL beside idemkit's PostgreSQL backend, protecting the same
no-op async function: calls/s, ratios and round trips.

idemkit is installed in an environment of the bench's own, never in the project's::

    python -m venv .venv-peers
    .venv-peers/bin/pip install -e '.[postgres]' 'idemkit[postgres]'
    .venv-peers/bin/python bench/peers_pg.py [--url URL] [--seconds 3]

Both sides use the async API on the same server and database, each on a table of its
own created fresh for the run (dropped at the end): onceonly's ``@idempotent`` on
``AsyncPostgresStore`` (psycopg 3) and idemkit's ``idempotent`` on ``PostgresBackend``
(asyncpg), local caches off. Each protects ``f(order_id) -> 1``; **new keys** call it
with an id never seen, **replays** with one already completed. Concurrency 1 and 8
(tasks on one event loop; pools large enough for 8). The two libraries alternate in
0.5 s slices (medians), so both see the same machine load.

Round trips: ReadyForQuery messages from the server, counted by a TCP proxy in front of
PostgreSQL (``leased_roundtrips.WireCounter``) in an untimed pass of 200 calls each.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
import uuid
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from leased_roundtrips import WireCounter, upstream

import onceonly

# idemkit warns that a tool without scope shares one namespace: as intended here
warnings.filterwarnings("ignore", message="idemkit: tool 'f' has no scope")

SLICE = 0.5  # seconds: the two libraries alternate in slices this long
Fn = Callable[[str], Awaitable[Any]]


async def rate(fn: Fn, keys: Callable[[], str], tasks: int, secs: float) -> float:
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


async def onceonly_fn(url: str, table: str) -> tuple[Fn, Callable[[], Awaitable[None]]]:
    store = onceonly.open_async_store(url, table=table, outbox_table=None, max_size=10)
    await store.migrate()

    @onceonly.idempotent(store, key=lambda order_id: order_id, scope="bench.f", ttl=3600)
    async def f(order_id: str) -> int:
        return 1

    return f, store.close


async def idemkit_fn(url: str, table: str) -> tuple[Fn, Callable[[], Awaitable[None]]]:
    import idemkit
    from idemkit.backends.postgres import PostgresBackend, _schema_sql

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_schema_sql(table))  # what `idemkit init-pg URL --table T` runs
    backend = PostgresBackend.from_url(url, table=table, min_size=2, max_size=10)
    config = idemkit.MethodConfig(expires_after_seconds=3600, use_local_cache=False)

    @idemkit.idempotent(backend=backend, config=config)
    async def f(order_id: str) -> int:
        return 1

    async def close() -> None:
        if backend._pool is not None:
            await backend._pool.close()

    return f, close


async def trips(
    wire: WireCounter, fn: Fn, new: Callable[[], str], replay: str
) -> tuple[float, float]:
    out = []
    for keys in (new, lambda: replay):
        mark = wire.mark()
        for _ in range(200):
            await fn(keys())
        await asyncio.sleep(0.05)  # the proxy's threads log the last replies
        out.append(sum(e.kind == "ready" for e in wire.since(mark)) / 200)
    return out[0], out[1]


async def run(url: str, secs: float) -> None:
    slices = max(1, round(secs / SLICE))
    suffix = uuid.uuid4().hex[:8]
    tables = {"onceonly": f"bench_oo_{suffix}", "idemkit": f"bench_ik_{suffix}"}
    wire = WireCounter(*upstream(url))
    fresh = itertools.count()

    def new_key() -> str:
        return f"n-{next(fresh)}"

    def replay_key() -> str:
        return "replay-key"

    made = {
        "onceonly": await onceonly_fn(url, tables["onceonly"]),
        "idemkit": await idemkit_fn(url, tables["idemkit"]),
    }
    counted = {
        "onceonly": await onceonly_fn(wire.url(url), tables["onceonly"]),
        # asyncpg takes unknown URL parameters for server settings: no gssencmode
        "idemkit": await idemkit_fn(
            wire.url(url).replace("&gssencmode=disable", ""), tables["idemkit"]
        ),
    }
    result: dict[tuple[str, str, int], float] = {}
    trip: dict[str, tuple[float, float]] = {}
    try:
        for name, (fn, _) in counted.items():
            await fn("replay-key")
            await fn("warm-up")  # prepared statements, pool connections
            trip[name] = await trips(wire, fn, new_key, "replay-key")
        for fn, _ in made.values():
            await fn("replay-key")
        for workload, keys in (("new", new_key), ("replay", replay_key)):
            for tasks in (1, 8):
                got: dict[str, list[float]] = {name: [] for name in made}
                for _ in range(slices):  # alternate, so both see the same machine load
                    for name, (fn, _) in made.items():
                        got[name].append(await rate(fn, keys, tasks, SLICE))
                for name in made:
                    result[name, workload, tasks] = statistics.median(got[name])
    finally:
        for _, close in (*made.values(), *counted.values()):
            await close()
        wire.close()
        with psycopg.connect(url, autocommit=True) as conn:
            for table in tables.values():
                conn.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    print(f"no-op async function on PostgreSQL; calls/s, median of {slices} slices of {SLICE} s")
    print(
        f"{'library':<10} {'new c1':>8} {'new c8':>8} {'replay c1':>10} {'replay c8':>10}"
        "  round trips new/replay"
    )
    for name in made:
        cells = [result[name, w, c] for w in ("new", "replay") for c in (1, 8)]
        print(
            f"{name:<10} {cells[0]:>8,.0f} {cells[1]:>8,.0f} {cells[2]:>10,.0f} "
            f"{cells[3]:>10,.0f}  {trip[name][0]:.1f} / {trip[name][1]:.1f}"
        )
    ratios = [
        result["onceonly", w, c] / result["idemkit", w, c]
        for w in ("new", "replay")
        for c in (1, 8)
    ]
    print(
        "onceonly / idemkit: "
        + ", ".join(f"{r:.2f}x" for r in ratios)
        + "  (new c1, new c8, replay c1, replay c8)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--seconds", type=float, default=3.0, help="per library and cell")
    args = parser.parse_args()
    asyncio.run(run(args.url, args.seconds))


if __name__ == "__main__":
    main()
