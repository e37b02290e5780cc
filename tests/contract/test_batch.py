# SPDX-License-Identifier: MIT
"""Inbox.process_batch / AsyncInbox.process_batch over every store (docs/spec.md §1.4):
one transaction per batch, a failing message rolls back alone, duplicates replay."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly import BatchItem
from onceonly.stores.memory import MemoryStore
from tests.conftest import StoreFactory, business_table


def items(*ids: str, **extra: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(i, {"id": i, **extra.get(i, {})}) for i in ids]


@pytest.fixture
def setup(store: Any) -> tuple[Any, Any]:
    """The store and a ledger row counter (None on memory)."""
    sql = not isinstance(store, MemoryStore)
    return store, business_table(store) if sql else None


def run(inbox: onceonly.Inbox, batch: Any, calls: list[str], store: Any) -> Any:
    """``process_batch`` with a handler that records its call, inserts a ledger row (SQL
    stores) and raises for payloads with ``boom``."""
    sql = not isinstance(store, MemoryStore)

    def handler(payload: dict[str, Any], tx: onceonly.Tx) -> Any:
        calls.append(payload["id"])
        if sql:
            tx.execute(
                f"INSERT INTO {store.table}_ledger (id, amount) VALUES (?, ?)", (payload["id"], 1)
            )
        if payload.get("boom"):
            raise RuntimeError(f"boom {payload['id']}")
        return {"charged": payload["id"]}

    return inbox.process_batch(batch, handler)


def test_a_batch_runs_each_key_once_and_replays_after(setup: tuple[Any, Any]) -> None:
    store, count = setup
    inbox = onceonly.Inbox(store, "billing")
    calls: list[str] = []
    out = run(inbox, items("c", "a", "b"), calls, store)
    assert [(o.key, o.result, o.replayed, o.ok) for o in out] == [
        ("c", {"charged": "c"}, False, True),
        ("a", {"charged": "a"}, False, True),
        ("b", {"charged": "b"}, False, True),
    ]
    assert sorted(calls) == ["a", "b", "c"]
    again = run(inbox, items("a", "b", "c"), calls, store)
    assert all(o.replayed and o.ok for o in again) and len(calls) == 3
    if count is not None:
        assert count() == 3


def test_a_failing_message_rolls_back_alone(setup: tuple[Any, Any]) -> None:
    store, count = setup
    inbox = onceonly.Inbox(store, "billing", max_attempts=2)
    calls: list[str] = []
    out = run(inbox, items("a", "b", "c", b={"boom": True}), calls, store)
    assert [o.ok for o in out] == [True, False, True]
    assert isinstance(out[1].error, RuntimeError) and out[1].result is None
    if count is not None:
        assert count() == 2  # b's insert rolled back with its savepoint
    record = onceonly.Admin(store).show("billing", "b")
    assert record is not None and record.state.value == "failed" and record.attempts == 1
    # the redelivered batch retries b only; its second failure makes it dead
    out = run(inbox, items("a", "b", "c", b={"boom": True}), calls, store)
    assert [o.replayed for o in out] == [True, False, True]
    assert calls.count("b") == 2
    out = run(inbox, items("b", b={"boom": True}), calls, store)
    assert isinstance(out[0].error, onceonly.DeadLettered)


def test_duplicates_inside_a_batch_replay_the_first(setup: tuple[Any, Any]) -> None:
    store, count = setup
    inbox = onceonly.Inbox(store, "billing")
    calls: list[str] = []
    batch = [("k", {"id": "k"}), ("k", {"id": "k"}), ("k", {"id": "k", "other": 1})]
    out = run(inbox, batch, calls, store)
    assert calls == ["k"]
    assert (out[0].replayed, out[1].replayed) == (False, True)
    assert out[1].result == out[0].result == {"charged": "k"}
    assert isinstance(out[2].error, onceonly.PayloadMismatch)
    if count is not None:
        assert count() == 1


def test_precounted_batch_with_a_repeated_key(store: Any) -> None:
    """precount_attempts: each message is counted once, a repeated key waits on nothing."""
    inbox = onceonly.Inbox(store, "billing", precount_attempts=True, wait=1.0)

    def handler(payload: dict[str, Any], tx: onceonly.Tx) -> str:
        if payload.get("boom"):
            raise ValueError("boom")
        return str(payload["id"])

    batch = [("a", {"id": "a"}), ("a", {"id": "a"}), ("b", {"id": "b", "boom": 1})]
    batch += [("b", {"id": "b", "boom": 1}), ("c", {"id": "c"})]
    out = inbox.process_batch(batch, handler)
    assert [(o.result, o.replayed) for o in out[:2]] == [("a", False), ("a", True)]
    assert isinstance(out[2].error, ValueError) and isinstance(out[3].error, ValueError)
    assert (out[4].result, out[4].replayed) == ("c", False)
    record = onceonly.Admin(store).show("billing", "b")
    assert record is not None and record.attempts == 2  # each run of b counted once
    assert onceonly.Admin(store).show("billing", "a").attempts == 0  # type: ignore[union-attr]


def test_bad_items(setup: tuple[Any, Any]) -> None:
    store, _ = setup
    inbox = onceonly.Inbox(store, "billing")
    calls: list[str] = []
    out = run(inbox, [("", {"id": "x"}), BatchItem("ok", {"id": "ok"})], calls, store)
    assert isinstance(out[0].error, onceonly.InvalidKey) and out[1].ok
    with pytest.raises(onceonly.ConfigurationError, match="batch item 0"):
        inbox.process_batch(["just-a-key"], lambda p, tx: None)  # type: ignore[list-item]
    assert inbox.process_batch([], lambda p, tx: None) == []


def test_a_store_failure_in_a_handler_commits_nothing(setup: tuple[Any, Any]) -> None:
    store, count = setup
    inbox = onceonly.Inbox(store, "billing")
    calls: list[str] = []
    sql = count is not None

    def handler(payload: Any, tx: onceonly.Tx) -> Any:
        calls.append(payload["id"])
        if sql:
            tx.execute(
                f"INSERT INTO {store.table}_ledger (id, amount) VALUES (?, 1)", (payload["id"],)
            )
        if payload["id"] == "b":
            raise onceonly.StoreUnavailable("the database went away")
        return 1

    with pytest.raises(onceonly.StoreUnavailable):
        inbox.process_batch(items("a", "b", "c"), handler)
    assert onceonly.Admin(store).list_records() == []
    if sql:
        assert count() == 0
    out = inbox.process_batch(items("a", "c"), handler)
    assert [o.replayed for o in out] == [False, False]


def test_overlapping_batches_in_two_threads_do_not_deadlock(sql_store: Any) -> None:
    """Two workers take the same keys in opposite orders, at once, many times."""
    inbox = onceonly.Inbox(sql_store, "billing")
    runs: list[str] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def handler(payload: Any, tx: onceonly.Tx) -> Any:
        with lock:
            runs.append(payload["id"])
        return 1

    def worker(reverse: bool, n: int) -> None:
        try:
            for r in range(n):
                keys = [f"r{r}-{i}" for i in range(8)]
                if reverse:
                    keys.reverse()
                out = inbox.process_batch([(k, {"id": k}) for k in keys], handler)
                assert all(o.ok or isinstance(o.error, onceonly.InFlight) for o in out), out
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(rev, 20)) for rev in (False, True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(runs) == len(set(runs)) == 160


def test_joined_to_the_callers_transaction(sql_store_factory: StoreFactory) -> None:
    """Joined: the caller's rollback undoes the whole batch; its commit keeps it."""
    store = sql_store_factory()
    store.migrate()
    inbox = onceonly.Inbox(store, "billing")
    with pytest.raises(RuntimeError), store.transaction() as s:
        out = inbox.process_batch(items("a", "b"), lambda p, tx: 1, connection=s.connection)
        assert all(o.ok for o in out)
        raise RuntimeError("the caller changes its mind")
    assert onceonly.Admin(store).list_records() == []
    with store.transaction() as s:
        inbox.process_batch(items("a", "b"), lambda p, tx: 1, connection=s.connection)
    assert len(onceonly.Admin(store).list_records()) == 2

    def unavailable(payload: Any, tx: onceonly.Tx) -> Any:
        if payload["id"] == "d":
            raise onceonly.StoreUnavailable("gone")
        return 1

    # a failed batch undoes all of its own work, even when the caller commits after
    with store.transaction() as s, pytest.raises(onceonly.StoreUnavailable):
        inbox.process_batch(items("c", "d"), unavailable, connection=s.connection)
    assert len(onceonly.Admin(store).list_records()) == 2


CRASH = """
import os, sys
import onceonly
store = onceonly.open_store(sys.argv[1], table=sys.argv[2], outbox_table=None)
inbox = onceonly.Inbox(store, "billing")
def handler(payload, tx):
    tx.execute(f"INSERT INTO {sys.argv[2]}_ledger (id, amount) VALUES (?, 1)", (payload,))
    if payload == "c":
        os._exit(9)  # the worker dies in the middle of the batch
    return 1
inbox.process_batch([(k, k) for k in "abcd"], handler)
"""


def test_a_worker_killed_mid_batch_commits_nothing(sql_store_factory: StoreFactory) -> None:
    store = sql_store_factory()
    store.migrate()
    count = business_table(store)
    done = subprocess.run(
        [sys.executable, "-c", CRASH, sql_store_factory.url, sql_store_factory.table],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")},
        check=False,
    )
    assert done.returncode == 9, done.stderr
    assert count() == 0
    assert onceonly.Admin(store).list_records() == []


async def test_async_batch(async_store: Any) -> None:
    inbox = onceonly.AsyncInbox(async_store, "billing")
    calls: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> Any:
        calls.append(payload["id"])
        if payload.get("boom"):
            raise ValueError("no")
        return payload["id"]

    out = await inbox.process_batch(items("b", "a", "x", x={"boom": True}), handler)
    assert [(o.key, o.result) for o in out] == [("b", "b"), ("a", "a"), ("x", None)]
    assert isinstance(out[2].error, ValueError)
    again = await inbox.process_batch(items("a", "b"), handler)
    assert all(o.replayed for o in again) and sorted(calls) == ["a", "b", "x"]


@pytest.mark.parametrize("kind", ["postgres", "pgpart", "pgbouncer", "mysql"])
@pytest.mark.parametrize("form", ["process", "process_batch"])
def test_a_precounted_duplicate_waits_no_longer_than_wait(
    kind: str, form: str, tmp_path: Path
) -> None:
    """With ``precount_attempts``, a delivery of a key another delivery holds in its
    transaction waits at most ``wait``, then InFlight (spec §1.2), in process() and in a
    batch (found black-box: the precount's own write waited for the holder's whole run)."""
    factory = StoreFactory(kind, tmp_path)  # (SQLite locks the whole database, not a key)
    store = factory()
    store.migrate()
    holder = onceonly.Inbox(store, consumer="c", wait=30.0)
    inbox = onceonly.Inbox(store, consumer="c", wait=0.5, precount_attempts=True)
    started, release = threading.Event(), threading.Event()

    def hold(payload: Any, tx: onceonly.Tx) -> Any:
        started.set()
        release.wait(10)
        return payload

    th = threading.Thread(target=lambda: holder.process("held", 1, hold))
    th.start()
    try:
        assert started.wait(10)
        t0 = time.monotonic()
        if form == "process":
            with pytest.raises(onceonly.InFlight):
                inbox.process("held", 1, lambda m, tx: m)
        else:
            out = inbox.process_batch([("held", 1), ("other", 2)], lambda m, tx: m)
            assert isinstance(out[0].error, onceonly.InFlight) and out[1].result == 2
        assert time.monotonic() - t0 < 4.0  # about `wait`, not the holder's run
    finally:
        release.set()
        th.join(10)
    try:
        assert inbox.process("held", 1, lambda m, tx: m).replayed
    finally:
        factory.close()
