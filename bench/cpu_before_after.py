# SPDX-License-Identifier: MIT
"""Client CPU per call of two versions of onceonly, side by side in one run.

Two worker processes import onceonly from two source trees: ``--before`` (a git
revision, exported with ``git archive``) and ``--after`` (default: this checkout's
``src``). The driver asks them in turn to run one case for ``--slice`` seconds,
alternating which goes first, ``--rounds`` times; each slice reports calls, wall time
and the worker's CPU time (user + system). Medians per case and the after/before
ratios are printed, so both versions see the same machine load.

Cases (one thread each):

* ``sqlite/hand``: a hand-written ``sqlite3`` transaction (bench/inbox_sqlite.py's
  ``hand``: ``BEGIN IMMEDIATE; INSERT INTO processed (key) VALUES (?) ON CONFLICT DO
  NOTHING RETURNING key; INSERT INTO ledger (key, amount) VALUES (?, ?); COMMIT``, WAL and
  the store's ``synchronous``), the reference for the next two;
* ``sqlite/inbox new`` and ``sqlite/inbox replay``: ``Inbox.process`` with the same
  ledger insert, on new keys and on completed ones;
* ``memory/leased new`` and ``memory/leased replay``: ``@idempotent`` on the memory store;
* ``pg/leased new`` and ``pg/leased replay``: ``@idempotent`` on PostgreSQL (``--url``;
  skipped with ``--no-pg``);
* ``redis/leased new`` and ``redis/leased replay``: ``@idempotent`` on ``RedisStore``
  (only with ``--redis URL``; its keys are removed at the end).

    .venv/bin/python bench/cpu_before_after.py --before e37aca0 [--rounds 7] [--slice 0.5]

A benchmark, not a test: it prints numbers and exits 0 unless it fails.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = os.environ.get(
    "ONCEONLY_BENCH_PG",
    os.environ.get("ONCEONLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"),
)
SQLITE_CASES = ["sqlite/hand", "sqlite/inbox new", "sqlite/inbox replay"]
LEASED_CASES = ["memory/leased new", "memory/leased replay"]
PG_CASES = ["pg/leased new", "pg/leased replay"]
REDIS_CASES = ["redis/leased new", "redis/leased replay"]


# -- the worker: runs inside one version


Cases = dict[str, Callable[[], None]]


def _cases(
    workdir: str, url: str | None, redis_url: str | None = None
) -> tuple[Cases, Callable[[], None]]:
    import sqlite3

    import onceonly

    counter = iter(range(10**12))
    run = secrets.token_hex(3)

    def fresh() -> str:
        return f"k{next(counter)}-{run}"

    store = onceonly.open_store(f"sqlite:///{workdir}/bench.db", migrate=True)
    with store.transaction() as s:
        s.execute("CREATE TABLE ledger (key TEXT, amount INTEGER)")
    inbox = onceonly.Inbox(store, "bench")
    conn = sqlite3.connect(f"{workdir}/bench.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")  # the store's settings (WAL, synchronous)
    conn.execute(f"PRAGMA synchronous = {store.synchronous}")
    conn.execute("CREATE TABLE processed (key TEXT PRIMARY KEY)")

    def handler(payload: Any, tx: Any) -> None:
        tx.execute("INSERT INTO ledger (key, amount) VALUES (?, ?)", (payload, 1))

    def hand() -> None:
        k = fresh()
        conn.execute("BEGIN IMMEDIATE")
        claimed = conn.execute(
            "INSERT INTO processed (key) VALUES (?) ON CONFLICT DO NOTHING RETURNING key", (k,)
        ).fetchone()
        if claimed is not None:
            conn.execute("INSERT INTO ledger (key, amount) VALUES (?, ?)", (k, 1))
        conn.execute("COMMIT")

    def inbox_new() -> None:
        k = fresh()
        inbox.process(k, k, handler)

    done = [fresh() for _ in range(2000)]
    for k in done:
        inbox.process(k, k, handler)
    replays = iter(range(10**12))

    def inbox_replay() -> None:
        k = done[next(replays) % len(done)]
        inbox.process(k, k, handler)

    cases: Cases = {
        "sqlite/hand": hand,
        "sqlite/inbox new": inbox_new,
        "sqlite/inbox replay": inbox_replay,
    }
    closers: list[Callable[[], object]] = [conn.close, store.close]

    def leased(prefix: str, target: Any) -> None:
        @onceonly.idempotent(target, key=lambda order_id: f"charge:{order_id}", scope="bench")
        def charge(order_id: str) -> dict[str, str]:
            return {"payment": f"pay-{order_id}"}

        paid = [fresh() for _ in range(500)]
        for k in paid:
            charge(k)
        again = iter(range(10**12))
        cases[f"{prefix}/leased new"] = lambda: charge(fresh()) and None
        cases[f"{prefix}/leased replay"] = lambda: charge(paid[next(again) % len(paid)]) and None

    leased("memory", onceonly.open_store("memory://"))
    if url is not None:
        table = f"bench_cpu_{os.getpid()}_{run}"
        pg = onceonly.open_store(url, table=table, min_size=1, max_size=1, migrate=True)
        leased("pg", pg)

        def drop() -> None:
            pg.close()
            import psycopg

            with psycopg.connect(url, autocommit=True) as c:
                c.execute(f"DROP TABLE IF EXISTS {table}")
                c.execute("DELETE FROM onceonly_schema WHERE component = %s", (f"records:{table}",))

        closers.append(drop)
    if redis_url is not None:
        prefix = f"bench_cpu_{os.getpid()}_{run}:"
        rs = onceonly.open_store(redis_url, prefix=prefix)
        rs.migrate()
        leased("redis", rs)

        def forget() -> None:
            keys = list(rs.client.scan_iter(match=f"{prefix}*", count=1000))
            for i in range(0, len(keys), 500):
                rs.client.delete(*keys[i : i + 500])
            rs.close()

        closers.append(forget)

    def close() -> None:
        for closer in closers:
            closer()

    return cases, close


def worker(url: str | None, redis_url: str | None = None) -> None:
    import onceonly

    with tempfile.TemporaryDirectory() as workdir:
        cases, close = _cases(workdir, url, redis_url)
        print(json.dumps({"ready": onceonly.__file__}), flush=True)
        try:
            for line in sys.stdin:
                name, seconds = json.loads(line)
                work = cases[name]
                n, wall0, cpu0 = 0, time.perf_counter(), time.process_time()
                stop = wall0 + seconds
                while time.perf_counter() < stop:
                    work()
                    n += 1
                wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
                print(json.dumps([n, wall, cpu]), flush=True)
        finally:
            close()


# -- the driver


class Worker:
    def __init__(
        self, label: str, src: Path, url: str | None, redis_url: str | None = None
    ) -> None:
        env = dict(os.environ, PYTHONPATH=str(src))
        argv = [sys.executable, __file__, "--worker"] + ([] if url is None else ["--url", url])
        argv += [] if redis_url is None else ["--redis", redis_url]
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

    def run(self, case: str, seconds: float) -> tuple[float, float]:
        """µs of wall time and of CPU time per call."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps([case, seconds]) + "\n")
        self.proc.stdin.flush()
        n, wall, cpu = json.loads(self._read())
        return wall / n * 1e6, cpu / n * 1e6

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
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--slice", type=float, default=0.5)
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--no-pg", action="store_true")
    parser.add_argument("--redis", default=None, help="a Redis URL: adds the redis cases")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    url = None if args.no_pg else args.url
    if args.worker:
        worker(url, args.redis)
        return
    cases = SQLITE_CASES + LEASED_CASES + ([] if url is None else PG_CASES)
    cases += [] if args.redis is None else REDIS_CASES
    with tempfile.TemporaryDirectory() as tmp:
        before = Worker("before", export(args.before, Path(tmp)), url, args.redis)
        after = Worker("after", Path(args.after).resolve(), url, args.redis)
        wall: dict[tuple[str, str], list[float]] = {}
        cpu: dict[tuple[str, str], list[float]] = {}
        started = time.time()
        load = os.getloadavg()[0]
        try:
            for r in range(args.rounds):
                for case in cases:
                    pair = (before, after) if r % 2 == 0 else (after, before)
                    for w in pair:
                        us, cpu_us = w.run(case, args.slice)
                        wall.setdefault((w.label, case), []).append(us)
                        cpu.setdefault((w.label, case), []).append(cpu_us)
        finally:
            before.close()
            after.close()
    load = max(load, os.getloadavg()[0])
    med = {k: statistics.median(v) for k, v in wall.items()}
    cmed = {k: statistics.median(v) for k, v in cpu.items()}
    print(
        f"{args.rounds} rounds x {args.slice:g} s per case and version, interleaved; "
        f"{time.time() - started:.0f} s; load average up to {load:.1f} on "
        f"{os.cpu_count()} cores; before = {args.before}, after = {args.after}"
    )
    print(
        f"{'case':<22}{'before µs':>11}{'after µs':>10}{'speed-up':>10}"
        f"{'before CPU µs':>15}{'after CPU µs':>14}{'CPU speed-up':>14}"
    )
    for case in cases:
        b, a = med[("before", case)], med[("after", case)]
        cb, ca = cmed[("before", case)], cmed[("after", case)]
        print(
            f"{case:<22}{b:>11.1f}{a:>10.1f}{b / a:>9.2f}x{cb:>15.1f}{ca:>14.1f}{cb / ca:>13.2f}x"
        )
    print("\nSQLite inbox / hand-written sqlite3 (throughput ratio, same process, same run):")
    for label in ("before", "after"):
        hand, cpu_hand = med[(label, "sqlite/hand")], cmed[(label, "sqlite/hand")]
        for case in ("sqlite/inbox new", "sqlite/inbox replay"):
            print(
                f"  {label:<7}{case:<22}{hand / med[(label, case)]:.2f}x wall"
                f"  {cpu_hand / cmed[(label, case)]:.2f}x CPU"
            )


if __name__ == "__main__":
    main()
