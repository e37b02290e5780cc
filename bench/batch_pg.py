# SPDX-License-Identifier: MIT
"""``Inbox.process_batch`` on PostgreSQL against per-message processing and the
hand-written ceilings, side by side in one run.

Every message has a new key and makes ONE business insert into a ledger. Cases:

* ``ceiling/msg``: by hand, one transaction per message (``INSERT … ON CONFLICT DO
  NOTHING`` claim, ledger insert, ``COMMIT``);
* ``inbox/msg``: ``inbox.process`` per message;
* ``inbox/batch``: ``inbox.process_batch`` of ``--batch`` messages (one transaction,
  a savepoint per message);
* ``ceiling/batch``: by hand, ``--batch`` messages per transaction (claim + ledger
  insert each, one ``COMMIT``), no savepoints.

Cases alternate in short slices (``--slice`` s, ``--rounds`` times) so that each sees the
same machine load; the table shows the median messages/s per case and the ratios.

    .venv/bin/python bench/batch_pg.py [--url URL] [--batch 100] [--rounds 5] [--slice 1]

A benchmark, not a test: it prints numbers and exits 0 unless it fails.
"""

from __future__ import annotations

import argparse
import itertools
import os
import secrets
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

import onceonly

URL = os.environ.get("ONCEONLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
_ids = itertools.count()


def key() -> str:
    return f"k{next(_ids)}-{secrets.token_hex(4)}"


def run_threads(threads: int, seconds: float, work: Callable[[int], int]) -> float:
    """Run ``work(i)`` repeatedly on ``threads`` threads for ``seconds``: messages/s."""
    done = [0] * threads
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        while time.monotonic() < stop:
            done[i] += work(i)

    pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    started = time.monotonic()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(done) / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=URL)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--slice", type=float, default=1.0)
    parser.add_argument("--concurrency", default="1,8")
    args = parser.parse_args()
    suffix = secrets.token_hex(3)
    table, claims, ledger = f"bb_rec_{suffix}", f"bb_claims_{suffix}", f"bb_ledger_{suffix}"
    store = onceonly.open_store(args.url, table=table, outbox_table=None, min_size=8, max_size=8)
    store.migrate()
    admin = psycopg.connect(args.url, autocommit=True)
    admin.execute(f"CREATE TABLE {ledger} (id text, amount int)")
    admin.execute(
        f"CREATE TABLE {claims} (scope text, key text, state text, token bigint,"
        " completed_at timestamptz, PRIMARY KEY (scope, key))"
    )
    conns = [psycopg.connect(args.url) for _ in range(8)]
    inbox = onceonly.Inbox(store, "bench")
    insert = f"INSERT INTO {ledger} (id, amount) VALUES (?, 1)"
    claim = (
        f"INSERT INTO {claims} (scope, key, state, token, completed_at) VALUES "
        "('bench', %s, 'completed', %s, clock_timestamp()) ON CONFLICT (scope, key) DO NOTHING"
    )
    hand_insert = f"INSERT INTO {ledger} (id, amount) VALUES (%s, 1)"

    def handler(payload: Any, tx: onceonly.Tx) -> None:
        tx.execute(insert, (payload,))

    def hand(conn: psycopg.Connection[Any], n: int) -> int:
        with conn.transaction():
            for _ in range(n):
                k = key()
                if conn.execute(claim, (k, 1)).rowcount:
                    conn.execute(hand_insert, (k,))
        return n

    batch = args.batch
    cases: dict[str, Callable[[int], int]] = {
        "ceiling/msg": lambda i: hand(conns[i], 1),
        "inbox/msg": lambda i: (inbox.process(key(), "x", handler), 1)[1],
        "inbox/batch": lambda i: len(
            inbox.process_batch([(k, k) for k in (key() for _ in range(batch))], handler)
        ),
        "ceiling/batch": lambda i: hand(conns[i], batch),
    }
    try:
        print(f"batch={batch}, {args.rounds} rounds of {args.slice:g} s per case, interleaved")
        print(f"{'case':<14}" + "".join(f"{'c' + c:>12}" for c in args.concurrency.split(",")))
        results: dict[tuple[str, int], list[float]] = {}
        for c in (int(x) for x in args.concurrency.split(",")):
            for work in cases.values():  # warm-up
                run_threads(c, 0.2, work)
            for _ in range(args.rounds):
                for name, work in cases.items():
                    results.setdefault((name, c), []).append(run_threads(c, args.slice, work))
        levels = [int(x) for x in args.concurrency.split(",")]
        med = {k: statistics.median(v) for k, v in results.items()}
        for name in cases:
            print(f"{name:<14}" + "".join(f"{med[(name, c)]:>12,.0f}" for c in levels))
        for a, b in (
            ("inbox/batch", "inbox/msg"),
            ("inbox/batch", "ceiling/msg"),
            ("inbox/batch", "ceiling/batch"),
            ("inbox/msg", "ceiling/msg"),
        ):
            ratios = "".join(f"{med[(a, c)] / med[(b, c)]:>11.2f}x" for c in levels)
            print(f"{a} / {b}".ljust(36) + ratios)
    finally:
        for conn in conns:
            conn.close()
        store.close()
        for t in (table, claims, ledger):
            admin.execute(f"DROP TABLE IF EXISTS {t} CASCADE")
        admin.close()


if __name__ == "__main__":
    main()
