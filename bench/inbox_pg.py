# SPDX-License-Identifier: MIT
"""Throughput of ``onceonly.Inbox`` (atomic mode) on PostgreSQL against hand-written psycopg.

Each message is processed in one transaction: the claim of its key plus ONE business
insert into a ledger, committed together.

* **onceonly**: ``Inbox(open_store(url, table=..., min_size=8, max_size=8))`` and
  ``inbox.process(key, payload, handler)``, where ``handler`` runs
  ``tx.execute("INSERT INTO <ledger> (id, amount) VALUES (?, ?)", ...)``.
* **processed** (what a user writes without a library), on a plain psycopg 3 connection
  per thread: ``CREATE TABLE processed (key text PRIMARY KEY, processed_at timestamptz
  NOT NULL DEFAULT now())``; per message ``BEGIN`` (psycopg's implicit one), ``INSERT
  INTO processed (key) VALUES ($1) ON CONFLICT DO NOTHING RETURNING key``, the ledger
  insert if a row came back, ``COMMIT``.
* **wide** (the second line): the same by hand on onceonly's own wide table (created by
  the same ``migrate()``, same indexes): ``INSERT INTO <claims> (scope, key, state,
  token, completed_at) VALUES (...) ON CONFLICT (scope, key) DO NOTHING``.

Every message has a new key, except in the replay rows, which re-deliver keys that
already completed (the baselines then run BEGIN, the claim insert that inserts nothing,
COMMIT). Each configuration (concurrency 1 and 8 by default) is warmed up, then measured
``--repeat`` times for ``--seconds`` per side, the three sides alternating in short
slices (``--slice``, 0.5 s) so all see the same machine load; the table shows the
medians. Beside each ratio it shows the CPU each message costs: this process (client) +
its PostgreSQL backends (server, read from ``/proc`` when the server runs on this
machine), and the load average is printed. The tables are dropped at the end. Last, the
round trips of one new message and of its replay are counted on the wire (libpq's trace)
for every side and printed with the table.

    .venv/bin/python bench/inbox_pg.py [--url URL] [--seconds 3] [--repeat 3]

This is a benchmark, not a test: it prints numbers and exits 0 unless it fails.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import platform
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import pq, sql

import onceonly
from onceonly.inbox import Tx

DEFAULT_URL = os.environ.get(
    "ONCEONLY_BENCH_PG",
    os.environ.get("ONCEONLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"),
)
SCOPE = "bench"
TARGET = 0.9

# Process messages on thread ``i`` until ``deadline``; returns how many were done.
Worker = Callable[[int, float], int]


@dataclass
class Tables:
    """Fresh, uniquely named tables for one run of the benchmark."""

    suffix: str = field(default_factory=lambda: f"{os.getpid()}_{secrets.token_hex(3)}")

    @property
    def records(self) -> str:
        return f"bench_records_{self.suffix}"

    @property
    def claims(self) -> str:
        return f"bench_claims_{self.suffix}"

    @property
    def processed(self) -> str:
        return f"bench_processed_{self.suffix}"

    @property
    def processed_ledger(self) -> str:
        return f"bench_processed_ledger_{self.suffix}"

    @property
    def ledger(self) -> str:
        return f"bench_ledger_{self.suffix}"

    @property
    def base_ledger(self) -> str:
        return f"bench_base_ledger_{self.suffix}"


@dataclass
class Keys:
    """Unique message keys, shared by the threads of one side."""

    prefix: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    counter: int = 0

    def take(self) -> tuple[str, int]:
        with self.lock:
            self.counter += 1
            n = self.counter
        return f"{self.prefix}-{n:09d}", n


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


def measure(worker: Worker, concurrency: int, seconds: float) -> tuple[int, float]:
    """Run ``worker`` on ``concurrency`` threads for ``seconds``: (messages, elapsed)."""
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
    start = time.perf_counter()
    deadline[0] = start + seconds
    barrier.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return sum(counts), elapsed


@dataclass
class Totals:
    """What one side did during one measurement."""

    messages: int = 0
    elapsed: float = 0.0
    client_cpu: float = 0.0
    server_cpu: float | None = 0.0

    def run(self, worker: Worker, concurrency: int, seconds: float, pids: Sequence[int]) -> None:
        cpu0, srv0 = time.process_time(), server_cpu(pids)
        n, elapsed = measure(worker, concurrency, seconds)
        cpu1, srv1 = time.process_time(), server_cpu(pids)
        self.messages += n
        self.elapsed += elapsed
        self.client_cpu += cpu1 - cpu0
        if self.server_cpu is not None and srv0 is not None and srv1 is not None:
            self.server_cpu += srv1 - srv0
        else:
            self.server_cpu = None

    @property
    def rate(self) -> float:
        return self.messages / self.elapsed


class OnceOnly:
    """The system under test: an Inbox on a PostgreSQL store."""

    def __init__(self, url: str, tables: Tables, pool_size: int, options: dict[str, Any]) -> None:
        self.store = onceonly.open_store(
            url, table=tables.records, min_size=pool_size, max_size=pool_size, **options
        )
        self.store.migrate()
        self.inbox = onceonly.Inbox(self.store, consumer=SCOPE)
        insert = f"INSERT INTO {tables.ledger} (id, amount) VALUES (?, ?)"

        def handler(payload: dict[str, Any], tx: Tx) -> None:
            tx.execute(insert, (payload["id"], payload["amount"]))

        self.handler = handler
        pool = getattr(self.store, "pool", None)
        self.pids: list[int] = []
        if pool is not None:  # the backends of every pooled connection, for their CPU
            conns = [pool.getconn() for _ in range(pool_size)]
            self.pids = [conn.info.backend_pid for conn in conns]
            for conn in conns:
                pool.putconn(conn)

    def new_keys(self, keys: Keys, completed: list[tuple[str, int]] | None = None) -> Worker:
        def work(_: int, deadline: float) -> int:
            n = 0
            process, handler = self.inbox.process, self.handler
            while time.perf_counter() < deadline:
                key, amount = keys.take()
                outcome = process(key, {"id": key, "amount": amount}, handler)
                assert not outcome.replayed
                if completed is not None:
                    completed.append((key, amount))
                n += 1
            return n

        return work

    def replays(self, done: Sequence[tuple[str, int]]) -> Worker:
        def work(_: int, deadline: float) -> int:
            n = 0
            process, handler = self.inbox.process, self.handler
            while time.perf_counter() < deadline:
                key, amount = done[n % len(done)]
                outcome = process(key, {"id": key, "amount": amount}, handler)
                assert outcome.replayed
                n += 1
            return n

        return work

    def close(self) -> None:
        self.store.close()


class Baseline:
    """The same work by hand, one psycopg connection per thread.

    ``narrow``: what a user writes without a library, a ``processed (key, processed_at)``
    table and ``INSERT ... ON CONFLICT DO NOTHING RETURNING key``; otherwise onceonly's
    own wide table (same schema and indexes as the records) with a bare claim insert.
    """

    def __init__(self, url: str, tables: Tables, connections: int, narrow: bool) -> None:
        self.conns = [psycopg.connect(url) for _ in range(connections)]
        self.pids = [conn.info.backend_pid for conn in self.conns]
        self.narrow = narrow
        if narrow:
            claim = sql.SQL(
                "INSERT INTO {} (key) VALUES (%s) ON CONFLICT DO NOTHING RETURNING key"
            ).format(sql.Identifier(tables.processed))
            ledger = tables.processed_ledger
        else:
            claim = sql.SQL(
                "INSERT INTO {} (scope, key, state, token, completed_at) "
                "VALUES (%s, %s, 'completed', 0, now()) ON CONFLICT (scope, key) DO NOTHING"
            ).format(sql.Identifier(tables.claims))
            ledger = tables.base_ledger
        self.claim = claim.as_bytes(None)
        self.insert = (
            sql.SQL(
                "INSERT INTO {} (key, amount) VALUES (%s, %s)"
                if narrow
                else "INSERT INTO {} (id, amount) VALUES (%s, %s)"
            )
            .format(sql.Identifier(ledger))
            .as_bytes(None)
        )

    def _message(self, conn: psycopg.Connection[Any], key: str, amount: int) -> bool:
        # psycopg sends BEGIN before the first statement (autocommit is off).
        params = (key,) if self.narrow else (SCOPE, key)
        inserted = conn.execute(self.claim, params).rowcount == 1
        if inserted:
            conn.execute(self.insert, (key, amount))
        conn.commit()
        return inserted

    def new_keys(self, keys: Keys, completed: list[tuple[str, int]] | None = None) -> Worker:
        def work(i: int, deadline: float) -> int:
            conn, n = self.conns[i], 0
            while time.perf_counter() < deadline:
                key, amount = keys.take()
                inserted = self._message(conn, key, amount)
                assert inserted
                if completed is not None:
                    completed.append((key, amount))
                n += 1
            return n

        return work

    def replays(self, done: Sequence[tuple[str, int]]) -> Worker:
        def work(i: int, deadline: float) -> int:
            conn, n = self.conns[i], 0
            while time.perf_counter() < deadline:
                key, amount = done[n % len(done)]
                inserted = self._message(conn, key, amount)
                assert not inserted
                n += 1
            return n

        return work

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


BASELINES = ("processed", "wide")


@dataclass
class Row:
    """One configuration: the measurements of every side, one Totals per repeat."""

    config: str
    onceonly: list[Totals] = field(default_factory=list)
    baselines: dict[str, list[Totals]] = field(
        default_factory=lambda: {name: [] for name in BASELINES}
    )

    def rate(self, side: str) -> float:
        totals = self.onceonly if side == "onceonly" else self.baselines[side]
        return statistics.median(t.rate for t in totals)

    def ratio(self, baseline: str) -> float:
        return self.rate("onceonly") / self.rate(baseline)

    def clear(self) -> None:
        self.onceonly.clear()
        for totals in self.baselines.values():
            totals.clear()

    @staticmethod
    def cpu(totals: list[Totals]) -> str:
        """Client + server CPU microseconds per message, over every repeat."""
        n = sum(t.messages for t in totals)
        client = 1e6 * sum(t.client_cpu for t in totals) / n
        servers = [t.server_cpu for t in totals]
        if any(s is None for s in servers):
            return f"{client:.0f}+?"
        server = 1e6 * sum(s for s in servers if s is not None) / n
        return f"{client:.0f}+{server:.0f}"


def interleaved(
    row: Row,
    sides: dict[str, tuple[Worker, Sequence[int]]],
    concurrency: int,
    seconds: float,
    slice_: float,
) -> None:
    """Measure every side for ``seconds``, alternating in slices (the order reversed
    every other slice).

    The machine's load drifts (other processes, checkpoints, autovacuum, fsync
    latency); short alternating slices expose every side to the same conditions.
    """
    totals = {name: Totals() for name in sides}
    slices = max(1, round(seconds / slice_))
    order = list(sides)
    for i in range(slices):
        for name in order if i % 2 == 0 else order[::-1]:
            worker, pids = sides[name]
            totals[name].run(worker, concurrency, seconds / slices, pids)
    row.onceonly.append(totals["onceonly"])
    for name in BASELINES:
        row.baselines[name].append(totals[name])


def compare(ours: OnceOnly, bases: dict[str, Baseline], args: argparse.Namespace) -> list[Row]:
    """Warm up, then measure every configuration ``args.repeat`` times."""
    run = secrets.token_hex(2)
    parties: dict[str, OnceOnly | Baseline] = {"onceonly": ours, **bases}
    keys = {name: Keys(f"{name[0]}{run}") for name in parties}
    # Keys completed at the first concurrency, redelivered by the replay measurements.
    done: dict[str, list[tuple[str, int]]] = {name: [] for name in parties}
    concurrencies: list[int] = args.concurrency
    rows = {c: Row(f"new keys, concurrency {c}") for c in concurrencies}
    replay_rows = {c: Row(f"replay, concurrency {c}") for c in concurrencies}

    def new_keys(seconds: float) -> None:
        for c in concurrencies:
            sides = {
                name: (
                    party.new_keys(keys[name], done[name] if c == concurrencies[0] else None),
                    party.pids,
                )
                for name, party in parties.items()
            }
            interleaved(rows[c], sides, c, seconds, args.slice)

    def replays(seconds: float) -> None:
        for c in concurrencies:
            sides = {
                name: (party.replays(done[name]), party.pids) for name, party in parties.items()
            }
            interleaved(replay_rows[c], sides, c, seconds, args.slice)

    # Warm-up: connections, prepared statements, caches; then the results are dropped.
    new_keys(args.warmup)
    replays(args.warmup)
    for row in (*rows.values(), *replay_rows.values()):
        row.clear()
    for r in range(args.repeat):
        new_keys(args.seconds)
        print(f"  repeat {r + 1}/{args.repeat}: new keys measured", file=sys.stderr, flush=True)
    for _ in range(args.repeat):
        replays(args.seconds)
    return [*rows.values(), *replay_rows.values()]


def count_round_trips(conn: psycopg.Connection[Any], action: Callable[[], object]) -> int:
    """Requests ``action`` sent after reading a reply (libpq's trace of ``conn``)."""
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            action()
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        sides = [line.split("\t")[0] for line in trace.read().splitlines() if line]
    return sum(1 for i, side in enumerate(sides) if side == "F" and (i == 0 or sides[i - 1] != "F"))


def round_trips(url: str, tables: Tables, options: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Round trips of one new message and of its replay, counted on the wire: onceonly
    (a store with one pooled connection, warmed up; last, a replay while most
    deliveries are replays, which reads first) and the baselines."""
    ours = OnceOnly(url, tables, 1, options)
    bases = {name: Baseline(url, tables, 1, narrow=name == "processed") for name in BASELINES}
    trips: dict[str, tuple[int, ...]] = {}
    try:
        for _ in range(10):  # psycopg prepares a statement on its fifth run
            key = f"w{secrets.token_hex(4)}"
            for _ in range(2):
                ours.inbox.process(key, {"id": key, "amount": 1}, ours.handler)
                for base in bases.values():
                    base._message(base.conns[0], key, 1)
        conn = ours.store.pool.getconn()
        ours.store.pool.putconn(conn)
        key = f"rt{secrets.token_hex(4)}"
        payload = {"id": key, "amount": 1}

        def process() -> object:
            return ours.inbox.process(key, payload, ours.handler)

        new = count_round_trips(conn, process)
        replay = count_round_trips(conn, process)
        for _ in range(24):  # most deliveries are replays now: the inbox reads first
            process()
        trips["onceonly"] = (new, replay, count_round_trips(conn, process))
        for name, base in bases.items():
            c = base.conns[0]
            trips[name] = (
                count_round_trips(c, lambda c=c, base=base: base._message(c, key, 1)),
                count_round_trips(c, lambda c=c, base=base: base._message(c, key, 1)),
            )
    finally:
        ours.close()
        for base in bases.values():
            base.close()
    return trips


def setup(url: str, tables: Tables) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for ledger in (tables.ledger, tables.base_ledger):
            conn.execute(
                sql.SQL("CREATE TABLE {} (id text PRIMARY KEY, amount bigint NOT NULL)").format(
                    sql.Identifier(ledger)
                )
            )
        # What a user writes without a library.
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (key text PRIMARY KEY, "
                "processed_at timestamptz NOT NULL DEFAULT now())"
            ).format(sql.Identifier(tables.processed))
        )
        conn.execute(
            sql.SQL("CREATE TABLE {} (key text PRIMARY KEY, amount bigint NOT NULL)").format(
                sql.Identifier(tables.processed_ledger)
            )
        )
    # The baseline's claims table: the same schema and indexes as onceonly's records.
    claims = onceonly.open_store(url, table=tables.claims, min_size=1, max_size=1)
    try:
        claims.migrate()
    finally:
        claims.close()


def cleanup(url: str, tables: Tables) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        names = (tables.records, tables.claims, tables.ledger, tables.base_ledger)
        for name in (*names, tables.processed, tables.processed_ledger):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
        if conn.execute("SELECT to_regclass('onceonly_schema')").fetchone() != (None,):
            conn.execute(
                "DELETE FROM onceonly_schema WHERE component = ANY(%s)",
                ([f"records:{tables.records}", f"records:{tables.claims}"],),
            )


def count_rows(url: str, table: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        query = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def describe(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    server = row[0] if row else "?"
    return (
        f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"psycopg {psycopg.__version__} ({psycopg.pq.__impl__}), PostgreSQL {server}, "
        f"onceonly {getattr(onceonly, '__version__', '?')}"
    )


def store_options(pipeline: str) -> dict[str, Any]:
    """``pipeline=`` for the store, when asked for and supported by this onceonly."""
    if pipeline == "auto":
        return {}
    from onceonly.stores.postgres import PostgresStore

    if "pipeline" not in inspect.signature(PostgresStore).parameters:
        raise SystemExit("this onceonly's PostgresStore has no pipeline option")
    return {"pipeline": pipeline == "on"}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", default=DEFAULT_URL, help="PostgreSQL URL (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=3.0, help="per side and repeat (3)")
    parser.add_argument("--repeat", type=int, default=3, help="measurements per config (3)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds per config (1)")
    parser.add_argument("--slice", type=float, default=0.5, help="alternation slice (0.5 s)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8], help="threads (1 8)")
    parser.add_argument(
        "--pipeline",
        choices=("auto", "on", "off"),
        default="auto",
        help="the store's pipeline option (default: the store decides)",
    )
    args = parser.parse_args(argv)
    pool = max(args.concurrency)
    options = store_options(args.pipeline)

    print(describe(args.url))
    print(
        f"{args.seconds:g} s per side x {args.repeat} repeats (median), slices of "
        f"{args.slice:g} s, {args.warmup:g} s warm-up; pool / connections: {pool}; "
        f"store pipeline: {args.pipeline}",
        flush=True,
    )
    tables = Tables()
    setup(args.url, tables)
    try:
        with contextlib.ExitStack() as stack:
            ours = OnceOnly(args.url, tables, pool, options)
            stack.callback(ours.close)
            bases = {
                name: Baseline(args.url, tables, pool, narrow=name == "processed")
                for name in BASELINES
            }
            for base in bases.values():
                stack.callback(base.close)
            rows = compare(ours, bases, args)
        trips = round_trips(args.url, tables, options)
        # The work really happened: one ledger row per completed new key.
        assert count_rows(args.url, tables.ledger) == count_rows(args.url, tables.records)
        assert count_rows(args.url, tables.base_ledger) == count_rows(args.url, tables.claims)
        assert count_rows(args.url, tables.processed_ledger) == count_rows(
            args.url, tables.processed
        )
    finally:
        cleanup(args.url, tables)

    print()
    header = (
        f"{'config':<26} {'baseline':<9} {'onceonly msg/s':>15} {'baseline msg/s':>15} "
        f"{'ratio':>6}  {'CPU us/msg client+server: onceonly':>34} {'baseline':>9}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        for name in BASELINES:
            print(
                f"{row.config:<26} {name:<9} {row.rate('onceonly'):>15,.0f} "
                f"{row.rate(name):>15,.0f} {row.ratio(name):>6.2f}  "
                f"{Row.cpu(row.onceonly):>34} {Row.cpu(row.baselines[name]):>9}"
            )
    print("(CPU = this process + its PostgreSQL backends, microseconds per message)")
    print(f"load average (1, 5, 15 min) at the end: {os.getloadavg()}")
    print()
    for row in rows:
        runs = " ".join(
            f"{x.rate:,.0f}/{y.rate:,.0f}/{z.rate:,.0f}"
            for x, y, z in zip(
                row.onceonly, *(row.baselines[name] for name in BASELINES), strict=True
            )
        )
        print(f"  {row.config}: onceonly/processed/wide msg/s per repeat: {runs}")
    print("\nround trips (counted on the wire, after a warm-up): new message / replay")
    print("  (onceonly's third figure: a replay while most deliveries are replays)")
    for side, counts in trips.items():
        print(f"  {side}: {' / '.join(str(n) for n in counts)}")
    met = all(row.ratio("processed") >= TARGET for row in rows if row.config.startswith("new"))
    print(f"\ntarget: ratio to processed >= {TARGET} for new keys at every concurrency: {met}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
