# SPDX-License-Identifier: MIT
"""Retention purge beside live claims on PostgreSQL: workers' latency with and without it.

    .venv/bin/python bench/purge_under_load.py --rows 1000000 --workers 8

Fills a fresh table with ``--rows`` expired records, then runs ``--workers`` threads
processing new keys through an ``Inbox`` while ONE purger deletes the expired rows in
batches (``--batch-size``, ``--pause``). The purger alternates: ``--slice`` seconds on,
``--slice`` seconds off, so both sides are measured interleaved under the same machine
load. Prints p50/p99 claim latency in each phase and the ratio, until the purge is done.
Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import threading
import time
import uuid

import psycopg

import onceonly
from onceonly._core.admin import PurgeRule
from onceonly.admin import Admin

URL = os.environ.get("ONCEONLY_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")


def _fill(table: str, rows: int) -> None:
    with psycopg.connect(URL, autocommit=True) as conn:
        step = 100_000
        for start in range(0, rows, step):
            conn.execute(
                f"INSERT INTO {table} (scope, key, state, token, attempts, result, completed_at,"
                " expires_at) SELECT 'old', 'k' || g, 'completed', g, 0, '1',"
                " clock_timestamp() - interval '2 days', clock_timestamp() - interval '1 day'"
                " FROM generate_series(%s, %s) AS g",
                (start + 1, min(start + step, rows)),
            )
        conn.execute(f"VACUUM ANALYZE {table}")


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000, help="expired rows to purge")
    parser.add_argument("--workers", type=int, default=8, help="threads claiming new keys")
    parser.add_argument("--batch-size", type=int, default=1000, help="purge batch size")
    parser.add_argument("--pause", type=float, default=0.0, help="pause between batches")
    parser.add_argument("--slice", type=float, default=1.0, help="seconds per on/off phase")
    args = parser.parse_args()
    table = f"bench_purge_{uuid.uuid4().hex[:8]}"
    store = onceonly.open_store(
        URL, table=table, outbox_table=None, min_size=args.workers + 1,
        max_size=args.workers + 1,
    )  # fmt: skip
    store.migrate()
    print(f"filling {args.rows:,} expired rows ...", flush=True)
    _fill(table, args.rows)
    inbox = onceonly.Inbox(store, consumer="new")
    purging = threading.Event()
    stop = threading.Event()
    lat: dict[bool, list[float]] = {True: [], False: []}
    lock = threading.Lock()

    def worker(w: int) -> None:
        i = 0
        while not stop.is_set():
            phase = purging.is_set()
            started = time.perf_counter()
            inbox.process(f"w{w}-{i}", i, lambda m, tx: None)
            took = time.perf_counter() - started
            if purging.is_set() == phase:  # drop calls that straddled a phase change
                with lock:
                    lat[phase].append(took)
            i += 1

    records = Admin(store).records  # what Admin.purge runs, paused between phases
    rule = PurgeRule(scope="old")
    deleted = 0

    def purger() -> None:
        nonlocal deleted
        while True:
            purging.wait()
            n = records.purge_batch(rule, args.batch_size)
            deleted += n
            if n < args.batch_size:
                return
            if args.pause:
                time.sleep(args.pause)

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(args.workers)]
    for t in threads:
        t.start()
    p = threading.Thread(target=purger, daemon=True)
    p.start()
    started = time.monotonic()
    while p.is_alive():
        purging.clear()
        time.sleep(args.slice)
        purging.set()
        time.sleep(args.slice)
    purge_seconds = time.monotonic() - started
    purging.clear()
    time.sleep(args.slice)
    stop.set()
    for t in threads:
        t.join()
    on, off = lat[True], lat[False]
    load = subprocess.run(["uptime"], check=False, capture_output=True, text=True).stdout
    print(f"load: {load.strip()}")
    print(f"purged {deleted:,} rows in ~{purge_seconds:.0f} s (half the time paused)")
    for name, values in (("without purge", off), ("during purge", on)):
        print(
            f"{name:>14}: {len(values):>7,} claims  p50 {_pct(values, 0.5) * 1000:6.2f} ms"
            f"  p99 {_pct(values, 0.99) * 1000:6.2f} ms"
            f"  mean {statistics.fmean(values) * 1000:6.2f} ms"
        )
    print(f"p99 ratio (during / without): {_pct(on, 0.99) / _pct(off, 0.99):.2f}")
    store.close()
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {table}")
        conn.execute("DELETE FROM onceonly_schema WHERE component = %s", (f"records:{table}",))


if __name__ == "__main__":
    main()
