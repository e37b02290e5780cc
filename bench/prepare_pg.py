# SPDX-License-Identifier: MIT
"""What not preparing statements costs on a direct PostgreSQL connection.

Behind a connection pooler the store does not prepare its statements (``prepare=None``
finds the pooler; docs/stores.md, "Behind PgBouncer"); this measures what that costs
where preparing would have worked. Two stores on the same server, ``prepare=True`` and
``prepare=False``, each on a table of its own, take turns in short slices (so both see
the same machine load) on:

* **atomic**: ``Inbox.process`` of a new key whose handler inserts one ledger row (claim,
  insert and completion in one transaction);
* **replay**: ``Inbox.process`` of a key that completed already (the claim alone);
* **leased**: a leased ``Inbox`` (``mode="leased"``) on a new key, a no-op handler
  (claim and completion, each its own transaction).

Each at concurrency 1 and 4; the table shows the medians of ``--rounds`` slices of
``--slice`` seconds per side: messages/s, and the CPU per message of this process
(client) and of the server's backends (read from ``/proc``, so only for a server on this
machine). The tables are dropped at the end.

    .venv/bin/python bench/prepare_pg.py [--url URL] [--rounds 7] [--slice 0.5]

This is a benchmark, not a test: it prints numbers and exits 0 unless it fails.
"""

from __future__ import annotations

import argparse
import itertools
import os
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

import onceonly

APP = "onceonly_bench_prepare"  # the application_name of the stores' connections
DEFAULT_URL = os.environ.get(
    "ONCEONLY_BENCH_PG",
    os.environ.get("ONCEONLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"),
)


def server_cpu(pids: Sequence[int]) -> float | None:
    """CPU seconds used so far by these PostgreSQL backends; None if not on this machine."""
    total = 0
    try:
        for pid in pids:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
    except (OSError, IndexError, ValueError):
        return None
    return total / os.sysconf("SC_CLK_TCK")


class Side:
    """One store (prepared or not) and its workloads."""

    def __init__(self, url: str, prepare: bool, concurrency: int) -> None:
        self.prepare = prepare
        self.table = f"bench_prep_{secrets.token_hex(4)}"
        sep = "&" if "?" in url else "?"
        self.store = onceonly.open_store(
            f"{url}{sep}application_name={APP}",
            table=self.table,
            outbox_table=None,
            prepare=prepare,
            min_size=concurrency,
            max_size=concurrency,
        )
        self.store.migrate()
        with self.store.transaction() as s:
            s.execute(f"CREATE TABLE {self.table}_ledger (id TEXT NOT NULL)")
        self.atomic = onceonly.Inbox(self.store, consumer="atomic")
        self.leased = onceonly.Inbox(self.store, consumer="leased", mode="leased")
        self.counter = itertools.count()
        self.done: list[str] = []  # completed atomic keys, replayed by "replay"

    def write(self, msg: Any, tx: onceonly.Tx) -> None:
        tx.execute(f"INSERT INTO {self.table}_ledger (id) VALUES (?)", (msg,))

    def run(self, workload: str, i: int) -> None:
        if workload == "atomic":
            key = f"k{next(self.counter)}"
            self.atomic.process(key, key, self.write)
            self.done.append(key)
        elif workload == "replay":
            key = self.done[i % len(self.done)]
            assert self.atomic.process(key, key, self.write).replayed
        else:
            key = f"l{next(self.counter)}"
            self.leased.process(key, key, lambda msg, tx: None)

    def pids(self) -> list[int]:
        with psycopg.connect(self.store.conninfo, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
                " AND pid <> pg_backend_pid()",
                (APP,),
            ).fetchall()
        return [r[0] for r in rows]

    def close(self) -> None:
        self.store.close()
        with psycopg.connect(self.store.conninfo, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {self.table}, {self.table}_ledger")
            conn.execute(
                "DELETE FROM onceonly_schema WHERE component = %s", (f"records:{self.table}",)
            )


def measure(
    run: Callable[[int], None], concurrency: int, seconds: float, pids: Sequence[int]
) -> tuple[float, float, float | None]:
    """``run`` on ``concurrency`` threads for ``seconds``: msg/s, client and server CPU
    seconds per message."""
    counts = [0] * concurrency
    errors: list[BaseException] = []
    deadline = time.perf_counter() + seconds

    def worker(t: int) -> None:
        n = 0
        try:
            while time.perf_counter() < deadline:
                run(t * 1_000_003 + n)
                n += 1
        except BaseException as exc:
            errors.append(exc)
        counts[t] = n

    cpu0, srv0, start = time.process_time(), server_cpu(pids), time.perf_counter()
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - start
    cpu1, srv1 = time.process_time(), server_cpu(pids)
    if errors:
        raise errors[0]
    n = max(1, sum(counts))
    server = None if srv0 is None or srv1 is None else (srv1 - srv0) / n
    return n / elapsed, (cpu1 - cpu0) / n, server


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--slice", type=float, default=0.5)
    args = parser.parse_args(argv)
    print(f"PostgreSQL {args.url.rsplit('@', 1)[-1]}, python {sys.version.split()[0]}")
    print(f"{args.rounds} slices of {args.slice}s per side, medians; CPU in µs per message")
    print()
    header = (
        f"{'workload':<8} {'conc':>4}  {'prepared/s':>10} {'unprepared/s':>12} {'ratio':>6}"
        f"  {'client µs p/u':>14}  {'server µs p/u':>14}"
    )
    print(header)
    print("-" * len(header))
    for concurrency in (1, 4):
        sides = [Side(args.url, True, concurrency), Side(args.url, False, concurrency)]
        try:
            for workload in ("atomic", "replay", "leased"):
                results: dict[bool, list[tuple[float, float, float | None]]] = {
                    True: [],
                    False: [],
                }
                for side in sides:  # warm up: connections open, statements prepared
                    measure(lambda i, s=side, w=workload: s.run(w, i), concurrency, 0.3, [])
                pids = sides[0].pids()  # both stores' backends: one side runs at a time
                for r in range(args.rounds):
                    order = sides if r % 2 == 0 else sides[::-1]
                    for side in order:
                        results[side.prepare].append(
                            measure(
                                lambda i, s=side, w=workload: s.run(w, i),
                                concurrency,
                                args.slice,
                                pids,
                            )
                        )
                p, u = results[True], results[False]
                rate_p = statistics.median(x[0] for x in p)
                rate_u = statistics.median(x[0] for x in u)
                cpu_p = statistics.median(x[1] for x in p) * 1e6
                cpu_u = statistics.median(x[1] for x in u) * 1e6
                srv_p = [x[2] for x in p if x[2] is not None]
                srv_u = [x[2] for x in u if x[2] is not None]
                server = (
                    f"{statistics.median(srv_p) * 1e6:>6.0f}/{statistics.median(srv_u) * 1e6:<6.0f}"
                    if srv_p and srv_u
                    else "n/a"
                )
                print(
                    f"{workload:<8} {concurrency:>4}  {rate_p:>10.0f} {rate_u:>12.0f}"
                    f" {rate_u / rate_p:>6.2f}  {cpu_p:>6.0f}/{cpu_u:<6.0f}  {server:>14}"
                )
        finally:
            for side in sides:
                side.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
