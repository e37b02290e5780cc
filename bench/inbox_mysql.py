# SPDX-License-Identifier: MIT
"""Throughput of ``onceonly.Inbox`` (atomic mode) on MariaDB/MySQL against a hand-written
transaction running the same statements.

Each message is processed in one transaction: the claim of its key plus ONE business
insert into a ledger, committed together.

* **onceonly**: ``Inbox(open_store(url, table=..., max_size=8))`` and
  ``inbox.process(key, payload, handler)``, where ``handler`` runs
  ``tx.execute("INSERT INTO <ledger> (id, amount) VALUES (?, ?)", ...)``.
* **baseline**: the statements onceonly sends, written by hand on a plain PyMySQL
  connection per thread (same settings: autocommit off per transaction, READ COMMITTED,
  UTC): ``BEGIN``; the claim ``INSERT … ON DUPLICATE KEY UPDATE`` with its lock-wait
  bound (on MariaDB ``… RETURNING`` the row; on MySQL a locking read of it follows); the
  ledger insert; ``COMMIT``. No fingerprint, no
  decision, no encoding: what is left is the library's own cost.

Every message has a new key. Concurrency 1 and 8; each configuration is warmed up, then
measured ``--repeat`` times for ``--seconds`` per side, the two sides alternating so both
see the same machine load; the table shows the medians and onceonly/baseline as a ratio
(the target is >= 0.9). The tables are dropped at the end.

    .venv/bin/python bench/inbox_mysql.py [--url URL] [--seconds 3] [--repeat 3]

This is a benchmark, not a test: it prints numbers and exits 0 unless it fails.
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pymysql
from pymysql.constants import CLIENT

import onceonly
from onceonly._core.fingerprint import fingerprint
from onceonly._core.state import State, Write
from onceonly._runtime import new_token
from onceonly.inbox import Tx
from onceonly.stores.mysql._sql import MySQLStatements, bounded, claim_values, parse_url

DEFAULT_URL = os.environ.get(
    "ONCEONLY_BENCH_MYSQL",
    os.environ.get("ONCEONLY_TEST_MYSQL", "mysql://root@127.0.0.1:3306/test"),
)
SCOPE = "bench"
TARGET = 0.9
Worker = Callable[[int, float], int]


class Keys:
    """Unique message keys shared by the threads of one side."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.lock = threading.Lock()
        self.n = 0

    def take(self) -> tuple[str, int]:
        with self.lock:
            self.n += 1
            return f"{self.prefix}-{self.n:09d}", self.n


def measure(worker: Worker, concurrency: int, seconds: float) -> tuple[float, float]:
    """Messages per second of ``worker`` on ``concurrency`` threads for ``seconds``, and
    this process's CPU microseconds per message."""
    counts = [0] * concurrency
    errors: list[BaseException] = []
    barrier = threading.Barrier(concurrency + 1)
    deadline = [0.0]

    def run(i: int) -> None:
        try:
            barrier.wait()
            counts[i] = worker(i, deadline[0])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    cpu = time.process_time()
    start = time.perf_counter()
    deadline[0] = start + seconds
    barrier.wait()
    for t in threads:
        t.join()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    if errors:
        raise errors[0]
    done = max(1, sum(counts))
    return done / elapsed, cpu / done * 1e6


def connect(url: str) -> Any:
    conn = pymysql.connect(
        **parse_url(url),
        autocommit=True,
        client_flag=CLIENT.FOUND_ROWS,
        init_command="SET time_zone = '+00:00'",
    )
    conn.cursor().execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return conn


def onceonly_worker(url: str, records: str, ledger: str, concurrency: int) -> tuple[Worker, Any]:
    store = onceonly.open_store(url, table=records, outbox_table=None, max_size=concurrency)
    store.migrate()
    inbox = onceonly.Inbox(store, consumer=SCOPE)
    insert = f"INSERT INTO {ledger} (id, amount) VALUES (?, ?)"
    keys = Keys(f"o{secrets.token_hex(3)}")

    def handler(payload: dict[str, Any], tx: Tx) -> None:
        tx.execute(insert, (payload["id"], payload["amount"]))

    def work(_: int, deadline: float) -> int:
        n = 0
        while time.perf_counter() < deadline:
            key, amount = keys.take()
            outcome = inbox.process(key, {"id": key, "amount": amount}, handler)
            assert not outcome.replayed
            n += 1
        return n

    return work, store


def baseline_worker(url: str, records: str, ledger: str, concurrency: int) -> tuple[Worker, Any]:
    conns = [connect(url) for _ in range(concurrency)]
    q = MySQLStatements.for_table(records)
    mariadb = "mariadb" in conns[0].get_server_info().lower()
    # MariaDB: one INSERT … RETURNING; MySQL: the insert, then the locking read
    claim = bounded(q.claim_returning if mariadb else q.claim, 5, mariadb)
    insert = f"INSERT INTO {ledger} (id, amount) VALUES (%s, %s)"
    keys = Keys(f"b{secrets.token_hex(3)}")

    def work(i: int, deadline: float) -> int:
        conn, n = conns[i], 0
        cur = conn.cursor()
        while time.perf_counter() < deadline:
            key, amount = keys.take()
            # what a claim writes in atomic mode: completed at once, result null
            write = Write(
                State.COMPLETED, new_token(), fingerprint({}), 0, completed=True, ttl_seconds=604800
            )
            conn.begin()
            cur.execute(claim, claim_values(SCOPE, key, write))
            if not mariadb:
                cur.execute(q.select_locked, (SCOPE, key))
            row = cur.fetchone()
            if row[4] == write.token:  # ours: run the "handler"
                cur.execute(insert, (key, amount))
            conn.commit()
            n += 1
        return n

    return work, conns


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    suffix = f"{os.getpid()}_{secrets.token_hex(3)}"
    records, claims = f"bench_records_{suffix}", f"bench_claims_{suffix}"
    ledgers = (f"bench_ledger_{suffix}", f"bench_base_ledger_{suffix}")
    admin = connect(args.url)
    cur = admin.cursor()
    for ledger in ledgers:
        cur.execute(f"CREATE TABLE {ledger} (id VARCHAR(64) NOT NULL, amount INT) ENGINE=InnoDB")
    onceonly.open_store(args.url, table=claims, outbox_table=None).migrate()
    print(f"onceonly {onceonly.__version__}, Python {platform.python_version()}, "
          f"{admin.get_server_info()}, {os.cpu_count()} CPUs")  # fmt: skip
    print(f"{args.seconds:g}s x {args.repeat} per side, medians; target ratio >= {TARGET}\n")
    print(
        f"{'concurrency':>11}  {'onceonly msg/s':>14}  {'baseline msg/s':>14}  {'ratio':>6}"
        f"  {'client CPU µs/msg onceonly':>26}  {'baseline':>8}"
    )
    worst = float("inf")
    try:
        for concurrency in (1, 8):
            mine, store = onceonly_worker(args.url, records, ledgers[0], concurrency)
            base, conns = baseline_worker(args.url, claims, ledgers[1], concurrency)
            measure(mine, concurrency, 0.5)  # warm up both
            measure(base, concurrency, 0.5)
            ours, theirs = [], []
            for _ in range(args.repeat):
                ours.append(measure(mine, concurrency, args.seconds))
                theirs.append(measure(base, concurrency, args.seconds))
            o, b = (statistics.median(r for r, _ in runs) for runs in (ours, theirs))
            oc, bc = (statistics.median(c for _, c in runs) for runs in (ours, theirs))
            worst = min(worst, o / b)
            print(
                f"{'c' + str(concurrency):>11}  {o:>14,.0f}  {b:>14,.0f}  {o / b:>5.2f}x"
                f"  {oc:>26,.0f}  {bc:>8,.0f}"
            )
            store.close()
            for conn in conns:
                conn.close()
    finally:
        for table in (records, claims, *ledgers):
            cur.execute(f"DROP TABLE IF EXISTS {table}")
        cur.execute(
            "DELETE FROM onceonly_schema WHERE component IN (%s, %s)",
            (f"records:{records}", f"records:{claims}"),
        )
        admin.close()
    print(f"\nworst ratio {worst:.2f}x ({'meets' if worst >= TARGET else 'below'} {TARGET}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
