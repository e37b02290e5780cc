# SPDX-License-Identifier: MIT
"""Cache tiers in front of PostgreSQL: replays from the local tier, and an inbox on a
70 %-duplicate workload with and without tiers.

1. ``@idempotent`` replays of one completed key answered by the local tier (no round
   trip), by 1 thread: calls/s, against the same replays answered by PostgreSQL.
2. ``Inbox.process`` on PostgreSQL (atomic mode: the claim, one ledger insert and the
   completion in one transaction) on a stream where 70 % of the deliveries repeat an
   earlier message id, then on one where every key is new (the Redis tier's lookup that
   misses is then pure cost: what a Bloom pre-check could save at most), by 1 and 8
   threads, for three stores (alternating in 0.5 s slices; medians): PostgreSQL alone; with a
   Redis tier only (what a fleet of processes shares); with a local tier and a Redis
   tier. Per delivery: PostgreSQL store operations and Redis commands, counted in a
   separate untimed pass of the same stream.

    .venv/bin/python bench/tiers.py [--pg URL] [--redis URL] [--seconds 2]

3. ``--local-replay [--before REV] [--rounds 7] [--slice 0.5]``: only the local tier, one
   thread, two versions side by side (the ``src`` of git revision ``REV``, default
   ``main``, against this checkout) in two worker processes that take turns every slice,
   with bench/cpu_before_after.py's method. Cases: ``@idempotent`` replays from the local
   tier of a ``TieredStore`` over PostgreSQL, a call of the same function on a new key,
   and the **floor** of a replay: a dict lookup, an expiry check, ``json.dumps(args,
   sort_keys=True)`` and SHA-256 of the arguments. The function takes one nested order
   (a dict holding a dict, a list of dicts, ints, floats, text, ``None``, a bool). Prints
   µs of wall and CPU time per call (medians), floor / replay per version, and the load.

This is a benchmark, not a test: it prints numbers; its tables and keys are removed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

import onceonly
from onceonly.stores.tiered import LocalTier, RedisTier, TieredStore

PG_URL = os.environ.get("ONCEONLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("ONCEONLY_TEST_REDIS", "redis://127.0.0.1:6379/0")
DUPLICATES = (0.7, 0.0)  # the second: every key new, what a Bloom pre-check could save
OPS = ("claim", "get", "update", "insert")
SLICE = 0.5  # seconds: the stores alternate in slices this long (medians)


class Stream:
    """Message ids where each delivery repeats an earlier id with probability
    ``duplicates``."""

    def __init__(self, tag: str, duplicates: float, seed: int = 1) -> None:
        self.tag, self.rng, self.seen = tag, random.Random(seed), 0
        self.duplicates = duplicates
        self.lock = threading.Lock()

    def next(self) -> str:
        with self.lock:
            if self.seen and self.rng.random() < self.duplicates:
                return f"{self.tag}-{self.rng.randrange(self.seen)}"
            self.seen += 1
            return f"{self.tag}-{self.seen - 1}"


def run_for(fn: Callable[[], None], threads: int, seconds: float) -> float:
    """Calls/s of ``fn`` by ``threads`` threads for ``seconds``."""
    counts = [0] * threads
    stop = threading.Event()
    barrier = threading.Barrier(threads + 1)

    def work(i: int) -> None:
        barrier.wait()
        n = 0
        while not stop.is_set():
            fn()
            n += 1
        counts[i] = n

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in pool:
        t.join()
    return sum(counts) / (time.perf_counter() - started)


def count_ops(store: Any, redis_client: Any, fn: Callable[[], None], n: int) -> tuple[float, float]:
    """PostgreSQL store operations and Redis commands per call of ``fn`` (n calls)."""
    pg_ops, redis_ops = [0], [0]
    with store.durable.session() if isinstance(store, TieredStore) else store.session() as s:
        cls = type(s)
    originals = {name: getattr(cls, name) for name in OPS}

    def spy(name: str) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            pg_ops[0] += 1
            return originals[name](self, *args, **kwargs)

        return wrapper

    send = redis_client.execute_command

    def counted(*args: Any, **options: Any) -> Any:
        redis_ops[0] += 1
        return send(*args, **options)

    redis_client.execute_command = counted
    try:
        for name in OPS:
            setattr(cls, name, spy(name))
        for _ in range(n):
            fn()
    finally:
        for name, f in originals.items():
            setattr(cls, name, f)
        del redis_client.execute_command
    return pg_ops[0] / n, redis_ops[0] / n


# -- 3. local-tier replays against their floor, two versions side by side

ROOT = Path(__file__).resolve().parent.parent
LOCAL_CASES = ("floor", "local replay", "new key")


def _order(i: int) -> dict[str, Any]:
    return {
        "id": f"ord-{i}",
        "amount": 1299 + i,
        "currency": "EUR",
        "customer": {"id": f"c-{i % 97}", "email": "buyer@example.com", "vip": False},
        "items": [
            {"sku": "A-1", "qty": 2, "price": 4.5},
            {"sku": "B-7", "qty": 1, "price": 3.99},
        ],
        "note": None,
    }


def _local_cases(pg_url: str) -> tuple[dict[str, Callable[[], object]], Callable[[], None]]:
    """The cases of one worker (inside one version of onceonly)."""
    tag = uuid.uuid4().hex[:10]
    table = f"tiers_local_{tag}"
    pg = onceonly.open_store(pg_url, table=table, outbox_table=None, min_size=1, max_size=1)
    pg.migrate()
    store = TieredStore(pg, local=LocalTier(10_000, 600))

    @onceonly.idempotent(store, key=lambda order: f"charge:{order['id']}", scope="bench")
    def charge(order: dict[str, Any]) -> dict[str, Any]:
        return {"payment": f"pay-{order['id']}", "amount": order["amount"]}

    done = [_order(i) for i in range(500)]
    for order in done:
        charge(order)
    # the floor's table: what a replay needs, ready (its expiry and its result)
    table_ = {("bench", f"charge:{o['id']}"): (time.time() + 3600, charge(o)) for o in done}
    fresh = (_order(i) for i in range(10**6, 10**9))
    turn = iter(range(10**12))

    def floor() -> object:
        order = done[next(turn) % len(done)]
        entry = table_.get(("bench", "charge:" + order["id"]))
        if entry is None or entry[0] <= time.time():
            raise SystemExit("the floor's entry expired")
        hashlib.sha256(json.dumps({"order": order}, sort_keys=True).encode()).hexdigest()
        return entry[1]

    def replay() -> object:
        return charge(done[next(turn) % len(done)])

    def close() -> None:
        with pg.transaction() as s:
            s.execute(f"DROP TABLE IF EXISTS {table}")
            s.execute("DELETE FROM onceonly_schema WHERE component = ?", (f"records:{table}",))
        pg.close()

    cases = {"floor": floor, "local replay": replay, "new key": lambda: charge(next(fresh))}
    return cases, close


def local_worker(pg_url: str) -> None:
    cases, close = _local_cases(pg_url)
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


class _Worker:
    def __init__(self, label: str, src: Path, pg_url: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(src))
        argv = [sys.executable, __file__, "--local-worker", "--pg", pg_url]
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


def local_replay(pg_url: str, before_rev: str, rounds: int, slice_: float) -> None:
    """Case 3 of the module docstring."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", before_rev, "src"],
            check=True,
            capture_output=True,
        ).stdout
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        workers = [
            _Worker("before", Path(tmp) / "src", pg_url),
            _Worker("after", ROOT / "src", pg_url),
        ]
        wall: dict[tuple[str, str], list[float]] = {}
        cpu: dict[tuple[str, str], list[float]] = {}
        loads = [os.getloadavg()[0]]
        started = time.time()
        try:
            for r in range(rounds):
                for case in LOCAL_CASES:
                    for w in workers if r % 2 == 0 else workers[::-1]:
                        us, cpu_us = w.run(case, slice_)
                        wall.setdefault((w.label, case), []).append(us)
                        cpu.setdefault((w.label, case), []).append(cpu_us)
                loads.append(os.getloadavg()[0])
        finally:
            for w in workers:
                w.close()
    med = {k: statistics.median(v) for k, v in wall.items()}
    cmed = {k: statistics.median(v) for k, v in cpu.items()}
    print(
        f"{rounds} rounds x {slice_:g} s per case and version, interleaved, 1 thread; "
        f"{time.time() - started:.0f} s; load average {min(loads):.1f}-{max(loads):.1f} "
        f"on {os.cpu_count()} cores; before = {before_rev}, after = this checkout"
    )
    print(f"{'case':<14}{'before µs':>11}{'after µs':>10}{'before CPU':>12}{'after CPU':>11}")
    for case in LOCAL_CASES:
        b, a = med[("before", case)], med[("after", case)]
        cb, ca = cmed[("before", case)], cmed[("after", case)]
        print(f"{case:<14}{b:>11.1f}{a:>10.1f}{cb:>12.1f}{ca:>11.1f}")
    for label in ("before", "after"):
        ratio = med[(label, "floor")] / med[(label, "local replay")]
        cratio = cmed[(label, "floor")] / cmed[(label, "local replay")]
        print(f"floor / local replay, {label:<6}: {ratio:.2f} wall, {cratio:.2f} CPU")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg", default=PG_URL)
    parser.add_argument("--redis", default=REDIS_URL)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--local-replay", action="store_true", help="case 3 only")
    parser.add_argument("--before", default="main", help="git revision (case 3)")
    parser.add_argument("--rounds", type=int, default=7, help="case 3")
    parser.add_argument("--slice", type=float, default=SLICE, help="case 3")
    parser.add_argument("--local-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.local_worker:
        local_worker(args.pg)
        return
    if args.local_replay:
        local_replay(args.pg, args.before, args.rounds, args.slice)
        return
    tag = uuid.uuid4().hex[:10]
    pg = onceonly.open_store(args.pg, table=f"tiers_{tag}", outbox_table=None, max_size=10)
    pg.migrate()
    cache = onceonly.open_store(args.redis, prefix=f"tiers_{tag}:")
    ledger = f"tiers_{tag}_ledger"
    with pg.transaction() as s:
        s.execute(f"CREATE TABLE {ledger} (id TEXT NOT NULL, amount INTEGER)")
    try:
        # 1. replays from the local tier vs from PostgreSQL
        print("@idempotent replays of one completed key, 1 thread")
        for name, store in (
            ("postgres", pg),
            ("local tier", TieredStore(pg, local=LocalTier(10_000, 60))),
        ):

            @onceonly.idempotent(store, key=lambda k: k, scope=f"replay-{name}", ttl=3600)
            def noop(k: str) -> int:
                return 1

            noop("k")
            rate = run_for(lambda fn=noop: fn("k"), 1, args.seconds)  # type: ignore[misc]
            print(f"  {name:<12} {rate:>10,.0f} replays/s")

        # 2. the inbox on a 70 %-duplicate stream, then on new keys only
        def handler(msg: dict[str, Any], tx: Any) -> str:
            tx.execute(f"INSERT INTO {ledger} (id, amount) VALUES (?, ?)", (msg["id"], 1))
            return "ok"

        configs: list[tuple[str, Callable[[], Any]]] = [
            ("postgres", lambda: pg),
            ("redis tier", lambda: TieredStore(pg, redis=RedisTier(cache, ttl=600))),
            (
                "local + redis tiers",
                lambda: TieredStore(
                    pg, local=LocalTier(100_000, 60), redis=RedisTier(cache, ttl=600)
                ),
            ),
        ]
        slices = max(1, round(args.seconds / SLICE))
        for dup in DUPLICATES:
            print(f"\nInbox on PostgreSQL, {dup:.0%} duplicates, one ledger insert per run")
            print(f"  {'store':<22} {'c1 msg/s':>9} {'c8 msg/s':>9}  pg ops  redis cmds  (per msg)")
            inboxes = [
                onceonly.Inbox(make(), consumer=f"bench{i}-{dup}", wait=10)
                for i, (_, make) in enumerate(configs)
            ]
            rates: dict[tuple[int, int], list[float]] = {}
            for threads in (1, 8):
                streams = [Stream(f"{i}-{threads}-{dup}", dup) for i in range(len(configs))]

                def deliver(inbox: Any, stream: Stream) -> None:
                    key = stream.next()
                    inbox.process(key, {"id": key}, handler)

                for inbox, stream in zip(inboxes, streams, strict=True):
                    for _ in range(300):  # warm: earlier ids to repeat
                        deliver(inbox, stream)
                for _ in range(slices):  # alternate, so all see the same machine load
                    for i, (inbox, stream) in enumerate(zip(inboxes, streams, strict=True)):
                        rates.setdefault((i, threads), []).append(
                            run_for(lambda ib=inbox, st=stream: deliver(ib, st), threads, SLICE)
                        )
            for i, (name, _) in enumerate(configs):
                inbox = inboxes[i]
                stream = Stream(f"{i}-count-{dup}", dup)
                counted = Counter[str]()

                def deliver_counted(
                    inbox: Any = inbox, stream: Stream = stream, counted: Counter[str] = counted
                ) -> None:
                    key = stream.next()
                    replayed = inbox.process(key, {"id": key}, handler).replayed
                    counted["replayed" if replayed else "run"] += 1

                tier = getattr(inbox.store, "redis", None)  # the Redis tier has its own client
                client = cache.client if tier is None else tier.client
                pg_ops, redis_ops = count_ops(inbox.store, client, deliver_counted, 2000)
                c1 = statistics.median(rates[i, 1])
                c8 = statistics.median(rates[i, 8])
                print(
                    f"  {name:<22} {c1:>9,.0f} {c8:>9,.0f}  {pg_ops:>6.2f}"
                    f"  {redis_ops:>10.2f}  ({counted['replayed'] / 2000:.0%} replayed)"
                )
    finally:
        with pg.transaction() as s:
            s.execute(f"DROP TABLE IF EXISTS {ledger}")
            s.execute(f"DROP TABLE IF EXISTS tiers_{tag}")
            s.execute("DELETE FROM onceonly_schema WHERE component = ?", (f"records:tiers_{tag}",))
        keys = list(cache.client.scan_iter(match=f"tiers_{tag}:*", count=1000))
        for i in range(0, len(keys), 500):
            cache.client.delete(*keys[i : i + 500])
        cache.close()
        pg.close()


if __name__ == "__main__":
    main()
