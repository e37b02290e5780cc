# SPDX-License-Identifier: MIT
"""Requests/s of a FastAPI endpoint through uvicorn, without and with the ASGI
``IdempotencyMiddleware`` (leased mode, PostgreSQL store), at concurrency 1 and 16.

The endpoint inserts one row (``bench/_http_app.py``). Three workloads, side by side in
one run, each against its own uvicorn process (one worker), alternating every
``--slice`` seconds so that load from elsewhere hits them alike:

* **bare**: no middleware (the header is sent and ignored);
* **new keys**: the middleware, a new ``Idempotency-Key`` per request (claim, run,
  store the response);
* **replays**: the middleware, keys completed beforehand (no handler run).

    .venv/bin/python bench/http_fastapi.py [--url URL] [--seconds 6] [--slice 0.5]
        [--idemkit-python PATH]   # a separate venv with idemkit, asyncpg and onceonly

This is a benchmark, not a test: the client (httpx) shares the machine with the server,
so the numbers are relative; the tables are dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import psycopg

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(
    url: str, table: str, mode: str, python: str = sys.executable
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "ONCEONLY_URL": url, "ONCEONLY_TABLE": table, "MIDDLEWARE": mode}
    proc = subprocess.Popen(
        [python, "-m", "uvicorn", "_http_app:app", "--app-dir", str(ROOT / "bench"),
         "--port", str(port), "--log-level", "warning", "--no-access-log"],
        env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("uvicorn did not start") from None
            time.sleep(0.05)


async def prepare(client: httpx.AsyncClient, keys: list[str]) -> None:
    """Warm the server up and complete ``keys`` (replayed later)."""
    for k in keys:
        r = await client.post("/orders", content=b"{}", headers={"Idempotency-Key": k})
        assert r.status_code == 201
    for _ in range(100):
        key = {"Idempotency-Key": str(uuid.uuid4())}
        assert (await client.post("/orders", content=b"{}", headers=key)).status_code == 201


async def timed(
    client: httpx.AsyncClient, keys: list[str] | None, concurrency: int, seconds: float
) -> tuple[int, float]:
    """Requests done and seconds taken by ``concurrency`` clients (answers checked)."""
    done = 0
    stop = time.perf_counter() + seconds

    async def worker(i: int) -> None:
        nonlocal done
        while time.perf_counter() < stop:
            key = keys[i] if keys is not None else str(uuid.uuid4())
            r = await client.post("/orders", content=b"{}", headers={"Idempotency-Key": key})
            assert r.status_code == 201, r.text
            if keys is not None:  # onceonly's marker, or idemkit's default one
                marked = r.headers.get("idempotent-replayed") or r.headers.get(
                    "idempotency-replayed"
                )
                assert marked == "true", r.headers
            done += 1

    began = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return done, time.perf_counter() - began


WORKLOADS = ["bare", "new keys", "replays"]
IDEMKIT = ["idemkit new keys", "idemkit replays"]


async def measure(
    bases: dict[str, str], seconds: float, slice_: float
) -> dict[tuple[str, int], float]:
    """Requests/s per workload and concurrency, the workloads alternating every slice."""
    out: dict[tuple[str, int], float] = {}
    for c in (1, 16):
        limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
        clients = {
            w: httpx.AsyncClient(base_url=bases[w], limits=limits, timeout=30) for w in bases
        }
        keys = [f"replay-{uuid.uuid4()}" for _ in range(c)]
        for w in bases:
            await prepare(clients[w], keys if w.endswith("replays") else [])
        totals = {w: [0, 0.0] for w in bases}
        for _ in range(max(1, round(seconds / slice_))):
            for w in bases:
                replays = keys if w.endswith("replays") else None
                n, t = await timed(clients[w], replays, c, slice_)
                totals[w][0] += n
                totals[w][1] += t
        for w in bases:
            out[(w, c)] = totals[w][0] / totals[w][1]
            await clients[w].aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    default = os.environ.get("ONCEONLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--url", default=os.environ.get("ONCEONLY_BENCH_PG", default))
    parser.add_argument("--seconds", type=float, default=6.0, help="per cell")
    parser.add_argument("--slice", type=float, default=0.5, help="alternation period")
    parser.add_argument(
        "--idemkit-python",
        help="an interpreter whose environment has idemkit (and this package): adds "
        "idemkit's ASGI middleware on its PostgreSQL backend to the comparison",
    )
    args = parser.parse_args()
    table = f"bench_http_{uuid.uuid4().hex[:8]}"
    procs = []
    try:
        bases = {}
        modes = {"bare": "0", "new keys": "1", "replays": "1"}
        for w in WORKLOADS:
            proc, bases[w] = start(args.url, table, modes[w])
            procs.append(proc)
        if args.idemkit_python:
            for w in IDEMKIT:
                proc, bases[w] = start(args.url, table, "idemkit", args.idemkit_python)
                procs.append(proc)
        results = asyncio.run(measure(bases, args.seconds, args.slice))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(f"DROP TABLE IF EXISTS {table}_orders")
            conn.execute(f"DROP TABLE IF EXISTS {table}_idemkit")
            if conn.execute("SELECT to_regclass('onceonly_schema')").fetchone()[0]:
                conn.execute(
                    "DELETE FROM onceonly_schema WHERE component = %s", (f"records:{table}",)
                )
    print(
        f"FastAPI + uvicorn (1 worker each), PostgreSQL, {args.seconds:.0f} s per cell, "
        f"workloads alternating every {args.slice} s"
    )
    head = ("concurrency", "bare req/s", "new keys", "ratio", "replays", "ratio")
    print("{:>11} {:>11} {:>10} {:>6} {:>9} {:>6}".format(*head))
    for c in (1, 16):
        bare, new, rep = (results[(w, c)] for w in WORKLOADS)
        print(
            f"{c:>11} {bare:>11.0f} {new:>10.0f} {new / bare:>6.2f} {rep:>9.0f} {rep / bare:>6.2f}"
        )
    if args.idemkit_python:
        print("idemkit's ASGI middleware, same endpoint and database (ratios to bare):")
        print("{:>11} {:>11} {:>10} {:>6} {:>9} {:>6}".format(*head))
        for c in (1, 16):
            bare = results[("bare", c)]
            new, rep = (results[(w, c)] for w in IDEMKIT)
            print(
                f"{c:>11} {bare:>11.0f} {new:>10.0f} {new / bare:>6.2f} {rep:>9.0f} "
                f"{rep / bare:>6.2f}"
            )


if __name__ == "__main__":
    main()
