# SPDX-License-Identifier: MIT
"""Crashes (DESIGN §6): a worker process is SIGKILLed or SIGSTOPped at chosen points.

Each delivery runs in its own process (``_worker.py``); a redelivery is the same worker
run again. Atomic mode must leave exactly one business effect; leased mode must fence
the stalled worker and hand the claim, with its checkpoints, to the next one.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly.stores.sqlite import SQLiteStore
from tests.conftest import StoreFactory, business_table
from tests.crash import _worker

WORKER = Path(_worker.__file__)
KEY = "msg-1"


def run_worker(factory: StoreFactory, mode: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run one delivery in a fresh process and wait for it to end."""
    return subprocess.run(
        [sys.executable, str(WORKER), mode, factory.url, factory.table, KEY, *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def ledger_rows(store: Any) -> list[tuple[str, int]]:
    with store.session() as s:
        rows = s.execute(f"SELECT id, amount FROM {store.table}_ledger").fetchall()
    return [(str(r[0]), int(r[1])) for r in rows]


def never(payload: Any, tx: Any) -> None:
    raise AssertionError("the handler ran again for a completed key")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("point", _worker.INBOX_POINTS)
def test_inbox_redelivery_after_kill_has_one_effect(
    sql_store_factory: StoreFactory, tmp_path: Path, point: str
) -> None:
    """A delivery SIGKILLed at any point, then redelivered, leaves exactly one ledger row."""
    store = sql_store_factory()
    store.migrate()
    business_table(store)
    acks = str(tmp_path / "acks.jsonl")

    first = run_worker(
        sql_store_factory, "inbox", "--run=first", f"--kill={point}", f"--acks={acks}"
    )
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert _worker.read_lines(acks) == []
    committed = point == "before_ack"
    assert ledger_rows(store) == ([(KEY, 10)] if committed else [])

    second = run_worker(sql_store_factory, "inbox", "--run=second", f"--acks={acks}")
    assert second.returncode == 0, second.stderr
    got = json.loads(second.stdout)
    if committed:  # the first run committed: the redelivery replays its result
        assert got == {"result": {"run": "first", "attempt": 1}, "replayed": True, "attempt": 1}
    else:  # nothing of the first run survived, not even its claim: a clean first attempt
        assert got == {"result": {"run": "second", "attempt": 1}, "replayed": False, "attempt": 1}
    assert ledger_rows(store) == [(KEY, 10)]
    assert [a["run"] for a in _worker.read_lines(acks)] == ["second"]

    again = onceonly.Inbox(store, consumer=_worker.CONSUMER, wait=1.0).process(
        KEY, {"id": KEY, "amount": 10}, never
    )
    assert again.replayed
    assert again.result == got["result"]
    assert ledger_rows(store) == [(KEY, 10)]


def kill_inside_idempotent(
    factory: StoreFactory, effects: str, checkpoint: Any = None
) -> subprocess.CompletedProcess[str]:
    """Run a worker that claims KEY with a 1 s lease and SIGKILLs itself inside the function."""
    args = ["--run=killed", "--kill=in_function", "--lease=1", f"--effects={effects}"]
    if checkpoint is not None:
        args.append(f"--checkpoint={json.dumps(checkpoint)}")
    done = run_worker(factory, "leased", *args)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert [e["run"] for e in _worker.read_lines(effects)] == ["killed"]
    return done


@pytest.mark.timeout(30)
def test_precounted_inbox_dead_letters_a_message_that_kills_every_worker(
    sql_store_factory: StoreFactory,
) -> None:
    """A handler that SIGKILLs its worker every time: with precount_attempts the key is
    dead after max_attempts deliveries and the next delivery does not run it."""
    store = sql_store_factory()
    store.migrate()
    business_table(store)
    opts = ("--max-attempts", "3", "--precount")
    for n in range(3):
        proc = run_worker(sql_store_factory, "inbox", "--run", f"r{n}",
                          "--kill", "handler_start", *opts)  # fmt: skip
        assert proc.returncode == -signal.SIGKILL, proc.stderr
    last = run_worker(sql_store_factory, "inbox", "--run", "last", *opts)
    assert last.returncode == 5, last.stderr
    assert json.loads(last.stdout) == {"error": "DeadLettered", "attempts": 3}


def test_idempotent_killed_is_in_flight_then_reclaimed(
    shared_leased_factory: StoreFactory, tmp_path: Path
) -> None:
    """A killed holder blocks callers until its lease ends; then attempt 2 runs and replays."""
    store = shared_leased_factory()
    store.migrate()
    effects = str(tmp_path / "effects.jsonl")
    kill_inside_idempotent(shared_leased_factory, effects)

    early = _worker.leased_function(store, run="early", effects=effects, wait=0.1)
    with pytest.raises(onceonly.InFlight) as info:
        early(KEY)
    assert info.value.retry_after is not None
    assert 0 < info.value.retry_after <= 1.0
    assert len(_worker.read_lines(effects)) == 1

    time.sleep(info.value.retry_after + 0.05)
    reclaim = _worker.leased_function(store, run="reclaim", effects=effects, wait=1.0)
    assert reclaim(KEY) == {"run": "reclaim", "attempt": 2, "checkpoints": {}}

    late = _worker.leased_function(store, run="late", effects=effects, wait=0.1)
    assert late(KEY) == {"run": "reclaim", "attempt": 2, "checkpoints": {}}
    assert [e["run"] for e in _worker.read_lines(effects)] == ["killed", "reclaim"]


@pytest.mark.timeout(30)
def test_idempotent_reclaim_resumes_from_checkpoint(
    shared_leased_factory: StoreFactory, tmp_path: Path
) -> None:
    """A checkpoint saved before a SIGKILL is handed to the reclaiming call (attempt 2)."""
    store = shared_leased_factory()
    store.migrate()
    effects = str(tmp_path / "effects.jsonl")
    saved = {"charged": 42, "ref": "pay-7"}
    kill_inside_idempotent(shared_leased_factory, effects, checkpoint=saved)

    reclaim = _worker.leased_function(store, run="reclaim", effects=effects, wait=3.0)
    assert reclaim(KEY) == {"run": "reclaim", "attempt": 2, "checkpoints": {"step1": saved}}
    assert _worker.read_lines(effects)[-1] == {"key": KEY, "run": "reclaim", "attempt": 2}


def sqlite_write_lock_free(store: Any) -> bool:
    """Whether another connection can take the SQLite write lock right now."""
    conn = sqlite3.connect(store.path, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


def stop_idle(pid: int, store: Any) -> None:
    """SIGSTOP ``pid``, retrying if it froze while holding SQLite's write lock (a renewal)."""
    for _ in range(100):
        os.kill(pid, signal.SIGSTOP)
        if not isinstance(store, SQLiteStore) or sqlite_write_lock_free(store):
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.005)
    raise AssertionError("the worker kept holding the SQLite write lock")


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.01)


@pytest.mark.timeout(30)
def test_idempotent_stopped_holder_loses_its_lease(
    shared_leased_factory: StoreFactory, tmp_path: Path
) -> None:
    """A SIGSTOPped holder is overtaken after its lease; resumed, it gets LeaseLost."""
    store = shared_leased_factory()
    store.migrate()
    effects = str(tmp_path / "effects.jsonl")
    started, release = tmp_path / "started", tmp_path / "release"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(WORKER),
            "leased",
            shared_leased_factory.url,
            shared_leased_factory.table,
            KEY,
            "--run=stopped",
            "--lease=1",
            f"--effects={effects}",
            f"--started={started}",
            f"--release={release}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(started, proc)
        time.sleep(0.5)  # let the heartbeat renew the lease at least once
        stop_idle(proc.pid, store)  # its heartbeat thread freezes with it
        winner = _worker.leased_function(store, run="winner", effects=effects, wait=5.0)
        assert winner(KEY) == {"run": "winner", "attempt": 2, "checkpoints": {}}
    finally:
        release.touch()
        os.kill(proc.pid, signal.SIGCONT)
        try:
            out, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 3, err
    assert json.loads(out)["error"] == "LeaseLost"

    late = _worker.leased_function(store, run="late", effects=effects, wait=0.1)
    assert late(KEY) == {"run": "winner", "attempt": 2, "checkpoints": {}}
    assert [e["run"] for e in _worker.read_lines(effects)] == ["stopped", "winner"]
