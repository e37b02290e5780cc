# SPDX-License-Identifier: MIT
"""Races (DESIGN §6): many threads and processes deliver the same keys; each runs once."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import StoreFactory, business_table
from tests.races import _worker

THREADS = 16
PROCESSES = 4
WORKER = Path(_worker.__file__)


def ledger_counts(store: Any, ledger: str) -> Counter[str]:
    """How many rows the business table holds per id."""
    with store.session() as s:
        rows = s.execute(f"SELECT id, count(*) FROM {ledger} GROUP BY id").fetchall()
    return Counter({str(row[0]): int(row[1]) for row in rows})


def run_threads(target: Callable[[int], list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """Run ``target(i)`` in THREADS threads started together; re-raise any thread's error."""
    barrier = threading.Barrier(THREADS)
    results: list[list[dict[str, Any]] | None] = [None] * THREADS
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a racing thread hung"
    if errors:
        raise errors[0]
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def run_processes(mode: str, factory: StoreFactory, effects: Path) -> list[list[dict[str, Any]]]:
    """Run PROCESSES workers that wait for one start signal, then race over every key."""
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                mode,
                factory.url,
                factory.table,
                f"p{i}",
                str(i),
                str(effects),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(PROCESSES)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line.strip() == "ready", p.communicate(timeout=10)
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
    return [json.loads(out) for out, _ in outputs]


def check_inbox_outcomes(runs: list[list[dict[str, Any]]], ledger: Counter[str]) -> None:
    """One ledger row and one first run per key; every delivery got the winner's result."""
    keys = set(_worker.KEYS)
    assert ledger == Counter(dict.fromkeys(keys, 1))
    assert all(sorted(o["key"] for o in run) == sorted(keys) for run in runs)
    outcomes = [o for run in runs for o in run]
    firsts = [o for o in outcomes if not o["replayed"]]
    assert sorted(o["key"] for o in firsts) == sorted(keys)
    winner = {o["key"]: o["result"] for o in firsts}
    assert all(o["result"] == winner[o["key"]] for o in outcomes)
    assert all(o["attempt"] == 1 and o["result"]["attempt"] == 1 for o in outcomes)


def check_leased_results(
    runs: list[list[dict[str, Any]]], workers: list[str], effects: list[str]
) -> None:
    """One effect per key; every caller got the result of the one that ran."""
    keys = set(_worker.KEYS)
    assert Counter(effects) == Counter(dict.fromkeys(keys, 1))
    ran_here: Counter[str] = Counter()
    for worker, run in zip(workers, runs, strict=True):
        assert sorted(o["key"] for o in run) == sorted(keys)
        ran_here.update(o["key"] for o in run if o["result"]["by"] == worker)
    assert ran_here == Counter(dict.fromkeys(keys, 1))
    winner: dict[str, Any] = {}
    for o in (o for run in runs for o in run):
        assert winner.setdefault(o["key"], o["result"]) == o["result"]
        assert o["result"]["attempt"] == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sharing", ["own-store", "shared-store"])
def test_inbox_threads_run_each_key_once(sql_store_factory: StoreFactory, sharing: str) -> None:
    """16 threads delivering the same 20 keys leave one ledger row and one first run per key."""
    store = sql_store_factory()
    store.migrate()
    business_table(store)
    ledger = f"{store.table}_ledger"

    def deliver(i: int) -> list[dict[str, Any]]:
        mine = store if sharing == "shared-store" else sql_store_factory()
        return _worker.process_all(mine, ledger, f"t{i}", seed=i)

    runs = run_threads(deliver)
    check_inbox_outcomes(runs, ledger_counts(store, ledger))


@pytest.mark.timeout(60)
def test_inbox_processes_run_each_key_once(sql_store_factory: StoreFactory, tmp_path: Path) -> None:
    """4 processes delivering the same 20 keys leave one ledger row and one first run per key."""
    store = sql_store_factory()
    store.migrate()
    business_table(store)
    runs = run_processes("inbox", sql_store_factory, tmp_path / "unused")
    check_inbox_outcomes(runs, ledger_counts(store, f"{store.table}_ledger"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sharing", ["own-store", "shared-store"])
def test_idempotent_threads_run_each_key_once(
    leased_store_factory: StoreFactory, tmp_path: Path, sharing: str
) -> None:
    """16 threads calling @idempotent (one scope) on the same 20 keys run each key once."""
    store_factory = leased_store_factory
    store = store_factory()
    store.migrate()
    effects = str(tmp_path / "effects.txt")
    workers = [f"t{i}" for i in range(THREADS)]

    def call(i: int) -> list[dict[str, Any]]:
        mine = store if sharing == "shared-store" else store_factory()
        return _worker.call_all(_worker.leased_function(mine, workers[i], effects), seed=i)

    runs = run_threads(call)
    check_leased_results(runs, workers, _worker.read_effects(effects))


@pytest.mark.timeout(60)
def test_idempotent_processes_run_each_key_once(
    shared_leased_factory: StoreFactory, tmp_path: Path
) -> None:
    """4 processes calling an @idempotent function on the same 20 keys run each key once."""
    store = shared_leased_factory()
    store.migrate()
    effects = tmp_path / "effects.txt"
    runs = run_processes("leased", shared_leased_factory, effects)
    workers = [f"p{i}" for i in range(PROCESSES)]
    check_leased_results(runs, workers, _worker.read_effects(str(effects)))
