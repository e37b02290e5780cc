# SPDX-License-Identifier: MIT
"""``Inbox.process_batch`` on PostgreSQL against per-message processing and the
hand-written ceilings, side by side in one run.

Every message has a new key and makes ONE business insert into a ledger. Cases:

* ``hand/msg``: by hand, one transaction per message (``BEGIN``; ``INSERT INTO processed
  (key) VALUES ($1) ON CONFLICT DO NOTHING RETURNING key``; the ledger insert; ``COMMIT``);
* ``inbox/msg``: ``inbox.process`` per message;
* ``inbox/batch``: ``inbox.process_batch`` of ``--batch`` messages with a per-message
  handler (one claim statement for the batch, the handler's insert and the completion
  per message, one ``COMMIT``);
* ``inbox/set``: ``inbox.process_batch(…, batch_handler=…)``: one ``INSERT … SELECT FROM
  unnest`` for the batch's ledger rows;
* ``hand/batch``: by hand, ``--batch`` messages per transaction (claim insert + ledger
  insert each, one ``COMMIT``), no savepoints;
* ``hand/unnest``: by hand, set-based: ``INSERT INTO processed (key) SELECT unnest($1)
  ON CONFLICT DO NOTHING RETURNING key``, then one ledger ``INSERT … SELECT FROM unnest``
  for the returned keys, one ``COMMIT``.

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
    parser.add_argument("--cases", default=None, help="comma-separated subset of the cases")
    args = parser.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    suffix = secrets.token_hex(3)
    table, processed, ledger = f"bb_rec_{suffix}", f"bb_processed_{suffix}", f"bb_ledger_{suffix}"
    n = max(levels)
    store = onceonly.open_store(args.url, table=table, outbox_table=None, min_size=n, max_size=n)
    store.migrate()
    admin = psycopg.connect(args.url, autocommit=True)
    admin.execute(f"CREATE TABLE {ledger} (id text, amount int)")
    admin.execute(f"CREATE TABLE {processed} (key text PRIMARY KEY)")
    conns = [psycopg.connect(args.url, autocommit=True) for _ in range(n)]
    inbox = onceonly.Inbox(store, "bench")
    insert = f"INSERT INTO {ledger} (id, amount) VALUES (?, 1)"
    claim = f"INSERT INTO {processed} (key) VALUES (%s) ON CONFLICT DO NOTHING RETURNING key"
    hand_insert = f"INSERT INTO {ledger} (id, amount) VALUES (%s, 1)"
    claim_all = (
        f"INSERT INTO {processed} (key) SELECT unnest(%s::text[]) ON CONFLICT DO NOTHING "
        "RETURNING key"
    )
    insert_all = f"INSERT INTO {ledger} (id, amount) SELECT unnest(%s::text[]), 1"

    def handler(payload: Any, tx: onceonly.Tx) -> None:
        tx.execute(insert, (payload,))

    def batch_handler(messages: list[onceonly.BatchMessage], tx: onceonly.Tx) -> None:
        tx.connection.execute(insert_all, ([m.key for m in messages],))

    def hand(conn: psycopg.Connection[Any], n: int) -> int:
        conn.execute("BEGIN")
        for _ in range(n):
            k = key()
            if conn.execute(claim, (k,)).fetchone() is not None:
                conn.execute(hand_insert, (k,))
        conn.execute("COMMIT")
        return n

    def hand_unnest(conn: psycopg.Connection[Any], n: int) -> int:
        conn.execute("BEGIN")
        keys = [key() for _ in range(n)]
        fresh = [row[0] for row in conn.execute(claim_all, (keys,)).fetchall()]
        conn.execute(insert_all, (fresh,))
        conn.execute("COMMIT")
        return n

    def batch_of(size: int) -> list[tuple[str, str]]:
        return [(k, k) for k in (key() for _ in range(size))]

    batch = args.batch
    cases: dict[str, Callable[[int], int]] = {
        "hand/msg": lambda i: hand(conns[i], 1),
        "inbox/msg": lambda i: (inbox.process(key(), "x", handler), 1)[1],
        "inbox/batch": lambda i: len(inbox.process_batch(batch_of(batch), handler)),
        "inbox/set": lambda i: len(
            inbox.process_batch(batch_of(batch), batch_handler=batch_handler)
        ),
        "hand/batch": lambda i: hand(conns[i], batch),
        "hand/unnest": lambda i: hand_unnest(conns[i], batch),
    }
    if args.cases:
        cases = {name: cases[name] for name in args.cases.split(",")}
    try:
        print(
            f"batch={batch}, {args.rounds} rounds of {args.slice:g} s per case, interleaved; "
            f"load before: {os.getloadavg()[0]:.2f}"
        )
        print(f"{'case':<14}" + "".join(f"{'c' + str(c):>12}" for c in levels))
        results: dict[tuple[str, int], list[float]] = {}
        for c in levels:
            for work in cases.values():  # warm-up
                run_threads(c, 0.2, work)
            for t in (table, processed, ledger):  # plans from real statistics
                admin.execute(f"ANALYZE {t}")
            for _ in range(args.rounds):
                for name, work in cases.items():
                    results.setdefault((name, c), []).append(run_threads(c, args.slice, work))
        med = {k: statistics.median(v) for k, v in results.items()}
        for name in cases:
            print(f"{name:<14}" + "".join(f"{med[(name, c)]:>12,.0f}" for c in levels))
        for a, b, target in (
            ("inbox/set", "hand/unnest", 0.5),
            ("inbox/batch", "hand/batch", 0.8),
            ("inbox/batch", "hand/msg", 10.0),
            ("inbox/set", "inbox/batch", None),
            ("inbox/batch", "inbox/msg", None),
        ):
            if (a, levels[0]) not in med or (b, levels[0]) not in med:
                continue
            ratios = "".join(f"{med[(a, c)] / med[(b, c)]:>11.2f}x" for c in levels)
            goal = "" if target is None else f"   (target >= {target:g}x)"
            print(f"{a} / {b}".ljust(28) + ratios + goal)
        print(f"load after: {os.getloadavg()[0]:.2f}")
    finally:
        for conn in conns:
            conn.close()
        store.close()
        for t in (table, processed, ledger):
            admin.execute(f"DROP TABLE IF EXISTS {t} CASCADE")
        admin.close()


if __name__ == "__main__":
    main()
