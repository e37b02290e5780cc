# SPDX-License-Identifier: MIT
"""Inbox (atomic mode) behaviour, the same over every store (docs/spec.md §1, §2)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import onceonly
from onceonly.stores.memory import MemoryStore
from tests.conftest import business_table


def ok_handler(calls: list[Any]) -> Any:
    def handler(payload: Any, tx: onceonly.Tx) -> Any:
        calls.append(payload)
        return {"charged": payload["amount"]}

    return handler


def test_first_delivery_runs_and_duplicate_replays(store: Any) -> None:
    """The handler runs once; the duplicate gets the stored result without running."""
    inbox = onceonly.Inbox(store, consumer="billing")
    calls: list[Any] = []
    first = inbox.process("m-1", {"id": "m-1", "amount": 5}, ok_handler(calls))
    again = inbox.process("m-1", {"amount": 5.0, "id": "m-1"}, ok_handler(calls))
    assert first == onceonly.Outcome({"charged": 5}, False, "m-1", 1)
    assert again == onceonly.Outcome({"charged": 5}, True, "m-1", 1)
    assert len(calls) == 1


def test_consumers_are_separate_scopes(store: Any) -> None:
    """The same key in two consumers runs once in each."""
    calls: list[Any] = []
    for consumer in ("billing", "emails"):
        inbox = onceonly.Inbox(store, consumer=consumer)
        assert not inbox.process("m-1", {"amount": 1}, ok_handler(calls)).replayed
    assert len(calls) == 2


def test_other_payload_same_key_is_mismatch(store: Any) -> None:
    """A reused key with another payload raises PayloadMismatch and keeps the record."""
    inbox = onceonly.Inbox(store, consumer="billing")
    calls: list[Any] = []
    inbox.process("m-1", {"amount": 5}, ok_handler(calls))
    with pytest.raises(onceonly.PayloadMismatch) as info:
        inbox.process("m-1", {"amount": 6}, ok_handler(calls))
    assert info.value.key == "m-1"
    assert inbox.process("m-1", {"amount": 5}, ok_handler(calls)).result == {"charged": 5}
    assert len(calls) == 1


def test_fields_limit_the_fingerprint(store: Any) -> None:
    """With fields=, other fields may differ between deliveries without a mismatch."""
    inbox = onceonly.Inbox(store, consumer="billing", fields=["amount"])
    calls: list[Any] = []
    inbox.process("m-1", {"amount": 5, "trace": "a"}, ok_handler(calls))
    assert inbox.process("m-1", {"amount": 5, "trace": "b"}, ok_handler(calls)).replayed
    with pytest.raises(onceonly.PayloadMismatch):
        inbox.process("m-1", {"amount": 7, "trace": "a"}, ok_handler(calls))


def test_failure_is_recorded_then_retried(store: Any) -> None:
    """A raising handler propagates; the next delivery runs again as attempt 2."""
    inbox = onceonly.Inbox(store, consumer="billing")
    attempts: list[int] = []

    def flaky(payload: Any, tx: onceonly.Tx) -> str:
        attempts.append(tx.attempt)
        if len(attempts) == 1:
            raise RuntimeError("gateway timeout")
        return "ok"

    with pytest.raises(RuntimeError, match="gateway timeout"):
        inbox.process("m-1", {"amount": 1}, flaky)
    out = inbox.process("m-1", {"amount": 1}, flaky)
    assert (out.result, out.replayed, out.attempt) == ("ok", False, 2)
    assert attempts == [1, 2]
    assert inbox.process("m-1", {"amount": 1}, flaky).replayed


def test_max_attempts_dead_letters(store: Any) -> None:
    """After max_attempts failures the key is dead and the handler no longer runs."""
    inbox = onceonly.Inbox(store, consumer="billing", max_attempts=3)
    runs: list[int] = []

    def broken(payload: Any, tx: onceonly.Tx) -> None:
        runs.append(tx.attempt)
        raise ValueError("poison")

    for _ in range(3):
        with pytest.raises(ValueError, match="poison"):
            inbox.process("m-1", {"amount": 1}, broken)
    with pytest.raises(onceonly.DeadLettered) as info:
        inbox.process("m-1", {"amount": 1}, broken)
    assert runs == [1, 2, 3]
    assert info.value.attempts == 3
    assert "poison" in (info.value.error or "")


def test_cached_errors_replay_to_duplicates(store: Any) -> None:
    """An error listed in cache_errors completes the key and is re-raised to duplicates."""

    class Declined(Exception):
        pass

    inbox = onceonly.Inbox(store, consumer="billing", cache_errors=(Declined,))
    runs: list[int] = []

    def decline(payload: Any, tx: onceonly.Tx) -> None:
        runs.append(1)
        raise Declined("card declined")

    for _ in range(3):
        with pytest.raises(Declined, match="card declined"):
            inbox.process("m-1", {"amount": 1}, decline)
    assert runs == [1]


def test_expired_completed_record_behaves_as_absent(store_factory: Any) -> None:
    """Past its ttl a completed key runs again, even with another payload."""
    if store_factory.kind == "memory":
        store = MemoryStore(clock=store_factory.clock)
    else:
        store = store_factory()
    store.migrate()
    inbox = onceonly.Inbox(store, consumer="billing", ttl=0.5)
    calls: list[Any] = []
    inbox.process("m-1", {"amount": 1}, ok_handler(calls))
    assert inbox.process("m-1", {"amount": 1}, ok_handler(calls)).replayed
    if store_factory.kind == "memory":
        store_factory.clock.advance(0.6)
    else:
        time.sleep(0.6)
    out = inbox.process("m-1", {"amount": 2}, ok_handler(calls))
    assert (out.replayed, out.result) == (False, {"charged": 2})
    assert len(calls) == 2


def test_concurrent_duplicate_waits_then_replays(store_factory: Any) -> None:
    """A duplicate arriving mid-run blocks on the first and then replays its result."""
    store = store_factory()
    store.migrate()
    started = threading.Event()
    release = threading.Event()
    runs: list[str] = []

    def slow(payload: Any, tx: onceonly.Tx) -> str:
        runs.append(threading.current_thread().name)
        started.set()
        release.wait(5)
        return "done"

    results: list[onceonly.Outcome[str]] = []
    first = threading.Thread(
        target=lambda: results.append(
            onceonly.Inbox(store, consumer="c").process("k", {"a": 1}, slow)
        )
    )
    first.start()
    assert started.wait(5)
    second_store = store if store_factory.kind != "sqlite" else store_factory()
    timer = threading.Timer(0.3, release.set)
    timer.start()
    t0 = time.monotonic()
    dup = onceonly.Inbox(second_store, consumer="c", wait=5).process("k", {"a": 1}, slow)
    waited = time.monotonic() - t0
    first.join(5)
    assert dup.replayed and dup.result == "done"
    assert waited >= 0.2
    assert len(runs) == 1
    assert results[0].replayed is False


def test_concurrent_duplicate_past_the_wait_is_in_flight(store_factory: Any) -> None:
    """A duplicate that waits longer than `wait` raises InFlight; the first still wins."""
    store = store_factory()
    store.migrate()
    started = threading.Event()
    release = threading.Event()

    def slow(payload: Any, tx: onceonly.Tx) -> str:
        started.set()
        release.wait(5)
        return "done"

    first = threading.Thread(
        target=lambda: onceonly.Inbox(store, consumer="c").process("k", {"a": 1}, slow)
    )
    first.start()
    assert started.wait(5)
    other = store if store_factory.kind != "sqlite" else store_factory()
    try:
        t0 = time.monotonic()
        with pytest.raises(onceonly.InFlight):
            onceonly.Inbox(other, consumer="c", wait=0.3).process("k", {"a": 1}, slow)
        assert 0.25 <= time.monotonic() - t0 < 3
    finally:
        release.set()
        first.join(5)
    assert onceonly.Inbox(store, consumer="c").process("k", {"a": 1}, slow).replayed


def test_handler_decorator(store: Any) -> None:
    """@inbox.handler(key=...) derives the key from the payload and returns an Outcome."""
    inbox = onceonly.Inbox(store, consumer="billing")
    calls: list[Any] = []

    @inbox.handler(key=lambda msg: msg["id"])
    def on_payment(msg: Any, tx: onceonly.Tx) -> int:
        calls.append(msg)
        return int(msg["amount"])

    assert on_payment({"id": "p-1", "amount": 3}) == onceonly.Outcome(3, False, "p-1", 1)
    assert on_payment({"id": "p-1", "amount": 3}).replayed
    assert on_payment.__name__ == "on_payment"
    assert len(calls) == 1


# -- atomicity: the business write and the claim commit or roll back together


def test_handler_writes_commit_with_the_claim(sql_store: Any) -> None:
    """The business row and the completion commit together; a replay adds no row."""
    count = business_table(sql_store)
    table = f"{sql_store.table}_ledger"
    inbox = onceonly.Inbox(sql_store, consumer="billing")

    def charge(payload: Any, tx: onceonly.Tx) -> str:
        tx.execute(f"INSERT INTO {table} (id, amount) VALUES (?, ?)", ("m-1", payload["amount"]))
        return "charged"

    inbox.process("m-1", {"amount": 5}, charge)
    inbox.process("m-1", {"amount": 5}, charge)
    assert count() == 1


def test_failed_handler_rolls_back_its_writes(sql_store: Any) -> None:
    """A handler that writes and then raises leaves no business row behind."""
    count = business_table(sql_store)
    table = f"{sql_store.table}_ledger"
    inbox = onceonly.Inbox(sql_store, consumer="billing")
    fail = [True]

    def charge(payload: Any, tx: onceonly.Tx) -> str:
        tx.execute(f"INSERT INTO {table} (id, amount) VALUES (?, ?)", ("m-1", 5))
        if fail[0]:
            raise RuntimeError("after the write")
        return "charged"

    with pytest.raises(RuntimeError):
        inbox.process("m-1", {"amount": 5}, charge)
    assert count() == 0
    fail[0] = False
    assert inbox.process("m-1", {"amount": 5}, charge).attempt == 2
    assert count() == 1


def test_unencodable_result_rolls_back(sql_store: Any) -> None:
    """A result that cannot be stored is a failure: writes roll back, EncodingError raised."""
    count = business_table(sql_store)
    table = f"{sql_store.table}_ledger"
    inbox = onceonly.Inbox(sql_store, consumer="billing")

    def charge(payload: Any, tx: onceonly.Tx) -> object:
        tx.execute(f"INSERT INTO {table} (id, amount) VALUES (?, ?)", ("m-1", 5))
        return object()

    with pytest.raises(onceonly.EncodingError):
        inbox.process("m-1", {"amount": 5}, charge)
    assert count() == 0


def test_oversized_result_is_too_large(sql_store: Any) -> None:
    """A result past max_result_bytes raises TooLarge and commits nothing."""
    count = business_table(sql_store)
    table = f"{sql_store.table}_ledger"
    inbox = onceonly.Inbox(sql_store, consumer="billing", max_result_bytes=100)

    def charge(payload: Any, tx: onceonly.Tx) -> str:
        tx.execute(f"INSERT INTO {table} (id, amount) VALUES (?, ?)", ("m-1", 5))
        return "x" * 200

    with pytest.raises(onceonly.TooLarge):
        inbox.process("m-1", {"amount": 5}, charge)
    assert count() == 0


def test_memory_store_has_no_sql() -> None:
    """tx.execute on the memory store says clearly that it has no SQL."""
    inbox = onceonly.Inbox(MemoryStore(), consumer="c")

    def handler(payload: Any, tx: onceonly.Tx) -> None:
        tx.execute("SELECT 1")

    with pytest.raises(onceonly.ConfigurationError, match="no SQL"):
        inbox.process("k", {}, handler)


def test_failure_record_never_overwrites_a_later_success(store: Any) -> None:
    """A run that fails, while another delivery completes the key before the failure is
    stored, leaves the completed record untouched (the failure write is fenced)."""
    winner: list[onceonly.Outcome[str]] = []

    class RacingInbox(onceonly.Inbox):
        def _record_failure(self, failed: Any, payload: Any, connection: Any) -> None:
            # between the failed run's rollback and its failure record, a redelivery wins
            winner.append(onceonly.Inbox(store, consumer="c").process("k", payload, ok))
            super()._record_failure(failed, payload, connection)

    def ok(payload: Any, tx: onceonly.Tx) -> str:
        return "won"

    def boom(payload: Any, tx: onceonly.Tx) -> str:
        raise RuntimeError("lost the race")

    with pytest.raises(RuntimeError):
        RacingInbox(store, consumer="c").process("k", {"a": 1}, boom)
    assert winner[0].replayed is False
    again = onceonly.Inbox(store, consumer="c").process("k", {"a": 1}, boom)
    assert (again.result, again.replayed, again.attempt) == ("won", True, 1)
