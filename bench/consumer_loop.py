# SPDX-License-Identifier: MIT
"""The consumer loop's own share of a message, before and after a change, side by side.

Two worker processes import onceonly from two source trees: ``--before`` (a git
revision, exported with ``git archive``; default ``main``) and ``--after`` (default:
this checkout's ``src``). The driver asks them in turn to run one case on
``--messages`` fresh entries of a Redis stream, alternating which goes first, for
``--rounds`` rounds; both see the same machine load. Every case runs an
``AsyncInbox`` on PostgreSQL (a fresh table per worker, a fresh scope per slice, a
pool of ``max(--concurrency)`` connections) whose handler does nothing but return.

Cases, at each concurrency ``c`` of ``--concurrency`` (default 1 and 8):

* ``inbox c``: ``inbox.process(id, payload, handler)`` alone, ``c`` at a time, on the
  slice's entries read beforehand by hand (XRANGE, untimed): the ceiling;
* ``hand c``: a hand-written consumer of the same entries: ``XREADGROUP COUNT c``,
  ``inbox.process`` of what it read (``c`` at a time), one XACK of those ids, again;
* ``loop c``: ``RedisStreamsConsumer(concurrency=c, count=c)``, ``batch_size=1``,
  timed from its start until its handler has run for every entry and the group has
  no entry pending.

Each slice writes its entries with one pipelined XADD (untimed) to a stream of its own.
Printed: medians of msg/s and of the worker's CPU µs per message (user + system), the
ratios ``loop / inbox``, ``hand / inbox`` and ``loop / hand`` of each version (taken
within each round, then the median), each case's after / before, and the machine's
load average. The
Redis commands and round trips per message of ``loop c`` are counted separately with
``tests/brokers/test_redis_streams_roundtrips.py``.

    .venv/bin/python bench/consumer_loop.py [--before main] [--rounds 5] [--messages 400]
        [--concurrency 1 8] [--url redis://...] [--pg postgresql://...]

A benchmark, not a test: it prints numbers and exits 0 unless it fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = os.environ.get("ONCEONLY_BENCH_REDIS", "redis://127.0.0.1:6379/0")
DEFAULT_PG = os.environ.get(
    "ONCEONLY_BENCH_PG",
    os.environ.get("ONCEONLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"),
)
KINDS = ("inbox", "hand", "loop")


# -- the worker: runs inside one version


class Cases:
    def __init__(self, url: str, pg: str, pool: int) -> None:
        import redis.asyncio

        import onceonly

        self.onceonly = onceonly
        self.tag = f"{os.getpid()}_{secrets.token_hex(3)}"
        self.table = f"bench_loop_{self.tag}"
        self.pg = pg
        self.r = redis.asyncio.Redis.from_url(url, max_connections=pool + 8)
        self.store = onceonly.open_async_store(
            pg, table=self.table, outbox_table=None, min_size=pool, max_size=pool
        )
        self.slices = iter(range(10**9))

    async def start(self) -> None:
        await self.store.migrate()
        for kind in KINDS:  # warm up every path
            await self.run(kind, 1, 50)
            await self.run(kind, 8, 50)

    async def close(self) -> None:
        await self.r.aclose()
        await self.store.close()
        import psycopg

        with psycopg.connect(self.pg, autocommit=True) as c:
            c.execute(f"DROP TABLE IF EXISTS {self.table}")
            c.execute(
                "DELETE FROM onceonly_schema WHERE component = %s", (f"records:{self.table}",)
            )

    async def run(self, kind: str, c: int, n: int) -> tuple[float, float]:
        """Seconds of wall time and of CPU time of one slice."""
        i = next(self.slices)
        stream, scope = f"bench-loop:{self.tag}:{i}", f"s{i}"
        pipe = self.r.pipeline(transaction=False)
        for k in range(n):
            mid = f"{self.tag}-{i}-{k}"
            fields = {
                "id": mid,
                "payload": json.dumps({"n": k, "id": mid}),
                "headers": '{"content-type":"application/json"}',
            }
            pipe.xadd(stream, fields)  # type: ignore[arg-type]
        await pipe.execute()
        inbox = self.onceonly.AsyncInbox(self.store, consumer=scope)
        try:
            return await getattr(self, f"_{kind}")(inbox, stream, c, n)
        finally:
            await self.r.delete(stream)

    async def _inbox(self, inbox: Any, stream: str, c: int, n: int) -> tuple[float, float]:
        entries = await self.r.xrange(stream)
        todo = [(f[b"id"].decode(), json.loads(f[b"payload"])) for _, f in entries][::-1]

        async def handler(payload: Any, tx: Any) -> None:
            return None

        async def worker() -> None:
            while todo:
                key, payload = todo.pop()
                await inbox.process(key, payload, handler)

        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(c)))
        return time.perf_counter() - wall, time.process_time() - cpu

    async def _hand(self, inbox: Any, stream: str, c: int, n: int) -> tuple[float, float]:
        async def handler(payload: Any, tx: Any) -> None:
            return None

        async def one(fields: dict[bytes, bytes]) -> None:
            await inbox.process(fields[b"id"].decode(), json.loads(fields[b"payload"]), handler)

        wall, cpu = time.perf_counter(), time.process_time()
        await self.r.xgroup_create(stream, "g", id="0")
        done = 0
        while done < n:
            reply = await self.r.xreadgroup("g", "hand", {stream: ">"}, count=c, block=100)
            for _, entries in reply or ():
                await asyncio.gather(*(one(f) for _, f in entries))
                await self.r.xack(stream, "g", *(eid for eid, _ in entries))
                done += len(entries)
        return time.perf_counter() - wall, time.process_time() - cpu

    async def _loop(self, inbox: Any, stream: str, c: int, n: int) -> tuple[float, float]:
        from onceonly.brokers.redis_streams import RedisStreamsConsumer

        ran = 0
        all_ran = asyncio.Event()

        async def handler(payload: Any, tx: Any) -> None:
            nonlocal ran
            ran += 1
            if ran >= n:
                all_ran.set()

        consumer = RedisStreamsConsumer(
            inbox,
            handler,
            connection=self.r,
            stream=stream,
            group="g",
            consumer_name="loop",
            concurrency=c,
            count=c,
            block_ms=100,
        )
        wall, cpu = time.perf_counter(), time.process_time()
        async with consumer:
            await all_ran.wait()
            while int((await self.r.xpending(stream, "g"))["pending"]):
                await asyncio.sleep(0.0005)
            took = time.perf_counter() - wall, time.process_time() - cpu
        return took


def worker(url: str, pg: str, pool: int) -> None:
    import onceonly

    async def serve() -> None:
        cases = Cases(url, pg, pool)
        await cases.start()
        print(json.dumps({"ready": onceonly.__file__}), flush=True)
        loop = asyncio.get_running_loop()
        try:
            while True:
                line = await loop.run_in_executor(None, sys.stdin.readline)
                if not line:
                    break
                kind, c, n = json.loads(line)
                print(json.dumps(await cases.run(kind, c, n)), flush=True)
        finally:
            await cases.close()

    asyncio.run(serve())


# -- the driver


class Worker:
    def __init__(self, label: str, src: Path, args: argparse.Namespace) -> None:
        env = dict(os.environ, PYTHONPATH=str(src))
        argv = [sys.executable, __file__, "--worker", "--url", args.url, "--pg", args.pg]
        argv += ["--concurrency", *map(str, args.concurrency)]
        self.label = label
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        ready = json.loads(self._read())
        if not ready["ready"].startswith(str(src)):
            raise SystemExit(f"{label}: imported {ready['ready']}, not from {src}")

    def _read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the {self.label} worker died")
        return line

    def run(self, kind: str, c: int, n: int) -> tuple[float, float]:
        """msg/s and CPU µs per message."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps([kind, c, n]) + "\n")
        self.proc.stdin.flush()
        wall, cpu = json.loads(self._read())
        return n / wall, cpu / n * 1e6

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)


def export(rev: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "src"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--before", default="main", help="git revision (default: main)")
    parser.add_argument("--after", default=str(ROOT / "src"), help="source tree (this one)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=400, help="entries per slice")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--url", default=DEFAULT_URL, help="Redis URL")
    parser.add_argument("--pg", default=DEFAULT_PG, help="PostgreSQL URL for the inbox")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.url, args.pg, max(args.concurrency))
        return
    cases = [(kind, c) for c in args.concurrency for kind in KINDS]
    rate: dict[tuple[str, str, int], list[float]] = {}
    cpu: dict[tuple[str, str, int], list[float]] = {}
    loads = [os.getloadavg()[0]]
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        before = Worker("before", export(args.before, Path(tmp)), args)
        after = Worker("after", Path(args.after).resolve(), args)
        try:
            for r in range(args.rounds):
                for kind, c in cases:
                    pair = (before, after) if r % 2 == 0 else (after, before)
                    for w in pair:
                        per_s, cpu_us = w.run(kind, c, args.messages)
                        rate.setdefault((w.label, kind, c), []).append(per_s)
                        cpu.setdefault((w.label, kind, c), []).append(cpu_us)
                loads.append(os.getloadavg()[0])
        finally:
            before.close()
            after.close()
    med = {k: statistics.median(v) for k, v in rate.items()}
    cmed = {k: statistics.median(v) for k, v in cpu.items()}
    print(
        f"Redis Streams consumer, {args.messages} messages per slice, {args.rounds} rounds, "
        f"versions interleaved; {time.time() - started:.0f} s; load average "
        f"{min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores; "
        f"before = {args.before}, after = {args.after}"
    )
    head = ("before msg/s", 14), ("after msg/s", 13), ("before CPU µs", 15), ("after CPU µs", 14)
    print(f"{'case':<10}" + "".join(f"{h:>{w}}" for h, w in head))
    for kind, c in cases:
        b, a = med[("before", kind, c)], med[("after", kind, c)]
        cb, ca = cmed[("before", kind, c)], cmed[("after", kind, c)]
        print(f"{kind} c{c:<5}{b:>14.0f}{a:>13.0f}{cb:>15.0f}{ca:>14.0f}")
    print("\nratios of msg/s, each within one round (the median over the rounds):")
    print(f"{'':10}{'loop / inbox':>14}{'hand / inbox':>14}{'loop / hand':>13}")

    def per_round(label: str, top: str, bottom: str, c: int) -> float:
        tops, bottoms = rate[(label, top, c)], rate[(label, bottom, c)]
        return statistics.median(t / b for t, b in zip(tops, bottoms, strict=True))

    for c in args.concurrency:
        for label in ("before", "after"):
            print(
                f"c{c} {label:<7}{per_round(label, 'loop', 'inbox', c):>14.2f}"
                f"{per_round(label, 'hand', 'inbox', c):>14.2f}"
                f"{per_round(label, 'loop', 'hand', c):>13.2f}"
            )
    print("\nafter / before, msg/s of the same case in the same round (median):")
    for kind, c in cases:
        b, a = rate[("before", kind, c)], rate[("after", kind, c)]
        print(f"  {kind} c{c}: {statistics.median(x / y for x, y in zip(a, b, strict=True)):.2f}")


if __name__ == "__main__":
    main()
