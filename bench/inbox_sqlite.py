# SPDX-License-Identifier: MIT
"""``Inbox`` on SQLite against a hand-written ``sqlite3`` transaction, side by side.

Each message: a new key and ONE business insert into a ledger, in one transaction.

* ``inbox``: ``Inbox(open_store("sqlite:///…"))`` and ``inbox.process(key, key, handler)``;
* ``hand``: the same file, a plain ``sqlite3`` connection with the store's settings (WAL,
  ``synchronous=NORMAL``, read back and printed): ``BEGIN IMMEDIATE; INSERT INTO processed
  (key) VALUES (?) ON CONFLICT DO NOTHING RETURNING key; INSERT INTO ledger (key, amount)
  VALUES (?, ?); COMMIT`` (``processed``: ``key TEXT PRIMARY KEY``);
* ``hand/row``: the statements ``Inbox`` sends, by hand: ``BEGIN IMMEDIATE``, a read of
  the key in onceonly's records table, the ledger insert, the insert of the completed
  record (15 columns and the table's ``(state, expires_at)`` index), ``COMMIT``: what
  ``Inbox`` would cost with no Python of its own, the ceiling of ``inbox / hand``;
* ``inbox/batch``: ``inbox.process_batch`` of ``--batch`` messages;
* ``inbox/replay``: ``inbox.process`` of keys already completed.

One thread (SQLite has one writer). The cases alternate in ``--slice`` second slices,
``--rounds`` times; the medians and their ratios are printed, by wall time and by this
process's CPU time (user + system, steadier on a shared machine), with the load average.

    .venv/bin/python bench/inbox_sqlite.py [--rounds 5] [--slice 1] [--batch 50]

A benchmark, not a test: it prints numbers and exits 0 unless it fails.
"""

from __future__ import annotations

import argparse
import itertools
import os
import secrets
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import onceonly

_ids = itertools.count()


def key() -> str:
    return f"k{next(_ids)}-{secrets.token_hex(4)}"


def rate(seconds: float, work: Callable[[], int]) -> tuple[float, float]:
    """Messages/s of ``work`` for ``seconds``, and this process's CPU µs per message."""
    done, start, cpu = 0, time.perf_counter(), time.process_time()
    stop = start + seconds
    while time.perf_counter() < stop:
        done += work()
    return done / (time.perf_counter() - start), (time.process_time() - cpu) / done * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--slice", type=float, default=1.0)
    parser.add_argument("--batch", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        store = onceonly.open_store(f"sqlite:///{d}/bench.db", migrate=True)
        with store.transaction() as s:
            s.execute("CREATE TABLE ledger (key TEXT, amount INTEGER)")
        inbox = onceonly.Inbox(store, "bench")
        conn = sqlite3.connect(f"{d}/bench.db", isolation_level=None)
        conn.execute(f"PRAGMA synchronous = {store.synchronous}")
        conn.execute("CREATE TABLE processed (key TEXT PRIMARY KEY)")
        with store.transaction() as s:  # the store's settings, read on its own connection
            mode = s.execute("PRAGMA journal_mode").fetchone()[0]
            sync = s.execute("PRAGMA synchronous").fetchone()[0]
        hand_mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        hand_sync = conn.execute("PRAGMA synchronous").fetchone()[0]
        assert (mode, sync) == (hand_mode, hand_sync), ((mode, sync), (hand_mode, hand_sync))

        def handler(payload: Any, tx: onceonly.Tx) -> None:
            tx.execute("INSERT INTO ledger (key, amount) VALUES (?, ?)", (payload, 1))

        def hand() -> int:
            k = key()
            conn.execute("BEGIN IMMEDIATE")
            claimed = conn.execute(
                "INSERT INTO processed (key) VALUES (?) ON CONFLICT DO NOTHING RETURNING key",
                (k,),
            ).fetchone()
            if claimed is not None:
                conn.execute("INSERT INTO ledger (key, amount) VALUES (?, ?)", (k, 1))
            conn.execute("COMMIT")
            return 1

        read_row = "SELECT state FROM onceonly_records WHERE scope = ? AND key = ?"
        claim_row = (
            "INSERT INTO onceonly_records (scope, key, created_at, state, fingerprint, token,"
            " attempts, lease_until, result, error, payload, checkpoint, updated_at,"
            " completed_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (scope, key) DO NOTHING"
        )
        fp = "2:" + "0" * 64
        row = (None, "null", None, None, None)  # lease_until, result, error, payload, checkpoint

        def hand_row() -> int:
            k = key()
            now = time.time()
            conn.execute("BEGIN IMMEDIATE")
            if conn.execute(read_row, ("bench", k)).fetchone() is None:
                conn.execute("INSERT INTO ledger (key, amount) VALUES (?, ?)", (k, 1))
                done_at = (now, now, now + 7 * 86400)
                conn.execute(claim_row, ("bench", k, now, "completed", fp, 1, 0, *row, *done_at))
            conn.execute("COMMIT")
            return 1

        done = [key() for _ in range(2000)]
        for k in done:
            inbox.process(k, k, handler)
        replays = itertools.count()

        def replay() -> int:
            k = done[next(replays) % len(done)]
            inbox.process(k, k, handler)
            return 1

        def one() -> int:
            k = key()
            inbox.process(k, k, handler)
            return 1

        def batch() -> int:
            keys = [key() for _ in range(args.batch)]
            return len(inbox.process_batch([(k, k) for k in keys], handler))

        cases = {
            "hand": hand,
            "hand/row": hand_row,
            "inbox": one,
            "inbox/batch": batch,
            "inbox/replay": replay,
        }
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        load = [os.getloadavg()[0]]
        for work in cases.values():
            rate(0.2, work)  # warm-up
        for _ in range(args.rounds):
            for name, work in cases.items():
                results[name].append(rate(args.slice, work))
            load.append(os.getloadavg()[0])
        med = {name: statistics.median(r for r, _ in v) for name, v in results.items()}
        cpu = {name: statistics.median(c for _, c in v) for name, v in results.items()}
        print(f"{args.rounds} rounds of {args.slice:g} s per case, interleaved, one thread")
        print(f"journal_mode={mode} synchronous={sync} (0 off, 1 normal, 2 full) on both")
        print(f"load average (1 min) {min(load):.2f}..{max(load):.2f}")
        for name, value in med.items():
            print(f"{name:<14}{value:>10,.0f} msg/s {cpu[name]:>7.1f} µs CPU/msg")
        for name in ("hand/row", "inbox", "inbox/batch", "inbox/replay"):
            print(
                f"{name + ' / hand':<22}{med[name] / med['hand']:.2f}x wall "
                f"{cpu['hand'] / cpu[name]:.2f}x CPU"
            )
        print(
            f"{'inbox / hand/row':<22}{med['inbox'] / med['hand/row']:.2f}x wall "
            f"{cpu['hand/row'] / cpu['inbox']:.2f}x CPU (the share left to the library's Python)"
        )
        conn.close()
        store.close()


if __name__ == "__main__":
    main()
