# SPDX-License-Identifier: MIT
"""The set-based ``process_batch`` on PostgreSQL (docs/spec.md §1.6a): every decision of
the one-statement claim is the one a single claim makes, failures are counted once,
overlapping batches do not deadlock, and a lost connection commits nothing. Interleaved
actors on a real server."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import onceonly
from onceonly._core.fingerprint import fingerprint
from onceonly._core.state import Policy, State, claim_write
from onceonly.inbox import _atomic as atomic
from tests.conftest import PG_URL, StoreFactory, business_table


def per_key(store: Any, consumer: str = "billing", **options: Any) -> onceonly.Inbox:
    """An inbox whose batches take the per-key path (a savepoint per message)."""
    inbox = onceonly.Inbox(store, consumer, **options)
    inbox._set_based = False
    return inbox


def ledger_handler(store: Any, calls: list[str] | None = None) -> Any:
    """A handler that inserts a ledger row, then raises for payloads with ``boom``
    (after writing) or ``early`` (before writing anything)."""

    def handler(payload: dict[str, Any], tx: onceonly.Tx) -> Any:
        if calls is not None:
            calls.append(payload["id"])
        if payload.get("early"):
            raise ValueError(f"refused {payload['id']}")
        tx.execute(f"INSERT INTO {store.table}_ledger (id, amount) VALUES (?, 1)", (payload["id"],))
        if payload.get("boom"):
            raise RuntimeError(f"boom {payload['id']}")
        return {"charged": payload["id"]}

    return handler


def record(store: Any, consumer: str, key: str) -> Any:
    return onceonly.Admin(store).show(consumer, key)


def stage(store: Any, consumer: str) -> None:
    """Records in every state a claim decides on, under ``consumer``."""
    inbox = onceonly.Inbox(store, consumer, max_attempts=2)
    ok = ledger_handler(store)

    def fail(payload: Any, tx: onceonly.Tx) -> Any:
        raise RuntimeError("no")

    inbox.process("done", {"id": "done"}, ok)
    inbox.process("mismatch", {"id": "mismatch", "v": 1}, ok)
    with pytest.raises(RuntimeError):
        inbox.process("failed", {"id": "failed"}, fail)
    for _ in range(2):
        with pytest.raises(RuntimeError):
            inbox.process("dead", {"id": "dead"}, fail)
    onceonly.Inbox(store, consumer, ttl=0.05).process("expired", {"id": "expired"}, ok)
    with store.session() as s:  # in_progress under a lease: one lapsed, one live
        for key, lease in (("lapsed", 0.05), ("leased", 60.0)):
            fp = fingerprint({"id": key})
            s.claim(consumer, key, claim_write(fp, 7, Policy(lease, 2)))
    time.sleep(0.1)


def shape(outcome: onceonly.Outcome[Any]) -> tuple[Any, ...]:
    error = None if outcome.error is None else type(outcome.error).__name__
    return (outcome.key, outcome.result, outcome.replayed, outcome.attempt, error)


def test_every_decision_is_the_single_claims(pg_store_factory: StoreFactory) -> None:
    """One batch over keys absent, completed, expired, failed, dead, mismatched, lapsed
    and held, duplicates included: the same outcomes and records as one key at a time."""
    store = pg_store_factory()
    store.migrate()
    business_table(store)
    keys = ["new", "done", "expired", "failed", "dead", "lapsed", "leased", "new", "done"]
    batch = [(k, {"id": k}) for k in keys] + [("mismatch", {"id": "mismatch", "v": 2})]
    results = {}
    for consumer, make in (("sets", onceonly.Inbox), ("keys", per_key)):
        stage(store, consumer)
        inbox = make(store, consumer, max_attempts=2, wait=0.1)
        results[consumer] = inbox.process_batch(batch, ledger_handler(store))
    assert [shape(o) for o in results["sets"]] == [shape(o) for o in results["keys"]]
    expected = {
        "new": (True, False), "done": (True, True), "expired": (True, False),
        "failed": (True, False), "dead": (False, False), "lapsed": (True, False),
        "leased": (False, False), "mismatch": (False, False),
    }  # fmt: skip
    for o in [*results["sets"][:7], results["sets"][9]]:
        assert (o.ok, o.replayed) == expected[o.key], o
    assert all(o.ok and o.replayed for o in results["sets"][7:9])  # the second copies
    kinds = {o.key: type(o.error).__name__ for o in results["sets"] if o.error is not None}
    assert kinds == {
        "dead": "DeadLettered",
        "leased": "InFlight",
        "mismatch": "PayloadMismatch",
    }
    # "failed" and "lapsed" (its lapsed run counted) retried as their second attempt
    assert results["sets"][3].attempt == results["sets"][5].attempt == 2
    for key in set(keys) | {"mismatch"}:
        a, b = record(store, "sets", key), record(store, "keys", key)
        assert (a.state, a.attempts, a.result, a.error is None) == (
            b.state,
            b.attempts,
            b.result,
            b.error is None,
        ), key


def test_a_failure_after_writing_is_counted_once_and_the_others_commit(
    pg_store_factory: StoreFactory,
) -> None:
    """b fails after its insert: the batch runs again without it (a and c once more, their
    first run rolled back); b's failure is recorded once, its insert undone."""
    store = pg_store_factory()
    store.migrate()
    count = business_table(store)
    inbox = onceonly.Inbox(store, "billing", max_attempts=2)
    calls: list[str] = []
    batch = [("a", {"id": "a"}), ("b", {"id": "b", "boom": True}), ("c", {"id": "c"})]
    out = inbox.process_batch(batch, ledger_handler(store, calls))
    assert [o.ok for o in out] == [True, False, True]
    assert isinstance(out[1].error, RuntimeError)
    assert calls == ["a", "b", "a", "c"]
    assert count() == 2
    b = record(store, "billing", "b")
    assert (b.state, b.attempts) == (State.FAILED, 1)
    out = inbox.process_batch(batch, ledger_handler(store, calls))
    assert [o.replayed for o in out] == [True, False, True]
    assert record(store, "billing", "b").state is State.DEAD  # the second failure: dead
    assert calls.count("b") == 2 and count() == 2


def test_a_failure_before_writing_is_recorded_in_place(pg_store_factory: StoreFactory) -> None:
    """b fails before writing anything: its failure is stored over its claim; no handler
    runs twice."""
    store = pg_store_factory()
    store.migrate()
    count = business_table(store)
    inbox = onceonly.Inbox(store, "billing")
    calls: list[str] = []
    batch = [("a", {"id": "a"}), ("b", {"id": "b", "early": True}), ("c", {"id": "c"})]
    out = inbox.process_batch(batch, ledger_handler(store, calls))
    assert [o.ok for o in out] == [True, False, True] and isinstance(out[1].error, ValueError)
    assert calls == ["a", "b", "c"] and count() == 2
    b = record(store, "billing", "b")
    assert (b.state, b.attempts, b.payload is not None) == (State.FAILED, 1, True)


def test_a_batch_handler_runs_the_new_messages_together(pg_store_factory: StoreFactory) -> None:
    """The batch handler gets the new messages only, in key order; its failure fails them
    all, each counted once, its writes undone, the others of the batch kept."""
    store = pg_store_factory()
    store.migrate()
    count = business_table(store)
    inbox = onceonly.Inbox(store, "billing", max_attempts=2)
    inbox.process("done", {"id": "done"}, ledger_handler(store))
    seen: list[list[tuple[str, int]]] = []
    fail = threading.Event()

    def insert_all(messages: list[onceonly.BatchMessage], tx: onceonly.Tx) -> list[str]:
        seen.append([(m.key, m.attempt) for m in messages])
        ids = [m.payload["id"] for m in messages]
        tx.connection.execute(
            f"INSERT INTO {store.table}_ledger (id, amount) SELECT unnest(%s::text[]), 1",
            (ids,),
        )
        if fail.is_set():
            raise RuntimeError("the batch failed")
        return [f"ok {i}" for i in ids]

    batch = [(k, {"id": k}) for k in ("y", "done", "x", "mismatch")]
    inbox.process("mismatch", {"id": "mismatch", "v": 1}, ledger_handler(store))
    fail.set()
    out = inbox.process_batch(batch, batch_handler=insert_all)
    assert seen == [[("x", 1), ("y", 1)]]
    assert [type(o.error).__name__ for o in out] == [
        "RuntimeError",
        "NoneType",
        "RuntimeError",
        "PayloadMismatch",
    ]
    assert out[1].replayed and count() == 2  # the two staged rows only
    for key in ("x", "y"):
        r = record(store, "billing", key)
        assert (r.state, r.attempts) == (State.FAILED, 1)
    fail.clear()
    out = inbox.process_batch(batch, batch_handler=insert_all)
    assert seen[-1] == [("x", 2), ("y", 2)]
    assert [(o.result, o.replayed, o.attempt) for o in out[:3]] == [
        ("ok y", False, 2),
        ({"charged": "done"}, True, 1),
        ("ok x", False, 2),
    ]
    assert count() == 4
    again = inbox.process_batch(batch[:3], batch_handler=insert_all)
    assert all(o.replayed for o in again) and len(seen) == 2

    class Later(Exception):
        pass

    uncounted = onceonly.Inbox(store, "other", uncounted_errors=(Later,))

    def later(messages: list[onceonly.BatchMessage], tx: onceonly.Tx) -> None:
        raise Later

    with pytest.raises(Later):
        uncounted.process_batch([("p", 1), ("q", 2)], batch_handler=later)
    assert record(store, "other", "p") is None and record(store, "other", "q") is None


def test_duplicates_with_a_batch_handler(pg_store_factory: StoreFactory) -> None:
    store = pg_store_factory()
    store.migrate()
    inbox = onceonly.Inbox(store, "billing")
    calls: list[list[str]] = []

    def handle(messages: list[onceonly.BatchMessage], tx: onceonly.Tx) -> list[str]:
        calls.append([m.key for m in messages])
        return [m.key.upper() for m in messages]

    out = inbox.process_batch([("k", 1), ("j", 1), ("k", 1), ("k", 2)], batch_handler=handle)
    assert calls == [["j", "k"]]
    assert [(o.result, o.replayed) for o in out[:3]] == [("K", False), ("J", False), ("K", True)]
    assert isinstance(out[3].error, onceonly.PayloadMismatch)


def test_a_key_held_by_an_open_transaction(pg_store_factory: StoreFactory) -> None:
    """Another worker's transaction holds k (uncommitted): the batch's claim waits
    ``wait`` for it, then the batch settles k as in flight and commits the others; once
    the holder committed, k replays."""
    store = pg_store_factory()
    store.migrate()
    inbox = onceonly.Inbox(store, "billing", wait=0.3)
    inside, release = threading.Event(), threading.Event()

    def slow(payload: Any, tx: onceonly.Tx) -> str:
        inside.set()
        assert release.wait(30)
        return "first"

    holder = threading.Thread(target=inbox.process, args=("k", {"id": "k"}, slow))
    holder.start()
    assert inside.wait(10)
    try:
        out = inbox.process_batch([("k", {"id": "k"}), ("x", {"id": "x"})], lambda p, tx: "b")
    finally:
        release.set()
        holder.join(30)
    assert isinstance(out[0].error, onceonly.InFlight) and out[1].result == "b"
    out = inbox.process_batch([("k", {"id": "k"}), ("x", {"id": "x"})], lambda p, tx: "b")
    assert [(o.result, o.replayed) for o in out] == [("first", True), ("b", True)]


def test_overlapping_batches_of_every_path_do_not_deadlock(pg_store_factory: StoreFactory) -> None:
    """Workers run shuffled, overlapping batches on one consumer at once: set-based,
    one key at a time, and with a batch handler, over keys some of which failed before
    (their claims are updates, not inserts). Each key's effect happens exactly once."""
    store = pg_store_factory(min_size=6, max_size=6)
    store.migrate()
    count = business_table(store)
    keys = [f"k{i:02d}" for i in range(40)]
    flaky = set(keys[::3])
    failing = onceonly.Inbox(store, "billing")
    for key in flaky:  # a failed attempt first: the batches retake these
        with pytest.raises(RuntimeError):
            failing.process(key, {"id": key}, _boom)
    table = f"{store.table}_ledger"

    def one(payload: Any, tx: onceonly.Tx) -> int:
        tx.execute(f"INSERT INTO {table} (id, amount) VALUES (?, 1)", (payload["id"],))
        return 1

    def together(messages: list[onceonly.BatchMessage], tx: onceonly.Tx) -> list[int]:
        ids = [m.payload["id"] for m in messages]
        tx.connection.execute(
            f"INSERT INTO {table} (id, amount) SELECT unnest(%s::text[]), 1", (ids,)
        )
        return [1] * len(ids)

    inboxes = [onceonly.Inbox(store, "billing"), per_key(store), onceonly.Inbox(store, "billing")]
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        rng = random.Random(n)
        try:
            for _ in range(12):
                chosen = rng.sample(keys, 12)
                batch = [(k, {"id": k}) for k in chosen]
                if n % 3 == 2:
                    out = inboxes[2].process_batch(batch, batch_handler=together)
                else:
                    out = inboxes[n % 3].process_batch(batch, one)
                for o in out:
                    assert o.ok or isinstance(o.error, onceonly.InFlight), o
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    done = [k for k in keys if (r := record(store, "billing", k)) and r.state is State.COMPLETED]
    with psycopg.connect(PG_URL) as conn:
        rows = conn.execute(f"SELECT id, count(*) FROM {table} GROUP BY id").fetchall()
    assert all(n == 1 for _, n in rows), rows
    assert sorted(k for k, _ in rows) == sorted(done)
    assert count() == len(done)


def _boom(payload: Any, tx: onceonly.Tx) -> Any:
    raise RuntimeError("first attempt fails")


@pytest.mark.parametrize("together", [False, True])
def test_a_connection_lost_mid_batch_commits_nothing(
    pg_store_factory: StoreFactory, together: bool
) -> None:
    """The batch's connection is killed while a handler runs: StoreUnavailable, nothing
    of the batch committed (no record, no ledger row, nothing counted); the redelivered
    batch runs whole."""
    store = pg_store_factory()
    store.migrate()
    count = business_table(store)
    inbox = onceonly.Inbox(store, "billing")
    table = f"{store.table}_ledger"
    kill = threading.Event()
    kill.set()

    def terminate(tx: onceonly.Tx) -> None:
        pid = tx.connection.info.backend_pid
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    def one(payload: Any, tx: onceonly.Tx) -> int:
        tx.execute(f"INSERT INTO {table} (id, amount) VALUES (?, 1)", (payload,))
        if payload == "c" and kill.is_set():
            terminate(tx)
            tx.execute("SELECT 1")
        return 1

    def many(messages: list[onceonly.BatchMessage], tx: onceonly.Tx) -> list[int]:
        for m in messages:
            one(m.payload, tx)
        return [1] * len(messages)

    batch = [(k, k) for k in "abcd"]
    run = (
        (lambda: inbox.process_batch(batch, batch_handler=many))
        if together
        else (lambda: inbox.process_batch(batch, one))
    )
    with pytest.raises(onceonly.StoreUnavailable):
        run()
    assert count() == 0 and onceonly.Admin(store).list_records() == []
    kill.clear()
    out = run()
    assert all(o.ok and not o.replayed and o.attempt == 1 for o in out)
    assert count() == 4


@pytest.fixture(params=["plain", "partitioned"])
def layout_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """PostgreSQL stores of both table layouts (the partitioned one claims key by key)."""
    factory = StoreFactory("postgres" if request.param == "plain" else "pgpart", tmp_path)
    yield factory
    factory.close()


def test_a_batch_locks_the_existing_keys_in_key_order_too(
    layout_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Right after a set-based batch's claim statement over [k1 (failed before), k2 (new)],
    a per-key batch of [k1, k2] starts: it must wait at k1, which the statement locked
    with the new k2 (in key order), not take k1 and then wait for k2 while the set-based
    batch waits for k1 (a deadlock)."""
    store = layout_factory()
    store.migrate()
    sets = onceonly.Inbox(store, "billing", wait=20)
    keys = per_key(store, wait=20)
    with pytest.raises(RuntimeError):
        keys.process("k1", {"id": "k1"}, _boom)
    batch = [(k, {"id": k}) for k in ("k1", "k2")]
    other: list[Any] = []

    def run_keys() -> None:
        try:
            other.append(keys.process_batch(batch, lambda p, tx: "keys"))
        except BaseException as exc:
            other.append(exc)

    worker = threading.Thread(target=run_keys)
    real = atomic.settle_claim

    def between(*args: Any, **kwargs: Any) -> Any:
        if not worker.is_alive() and not other:
            worker.start()  # the per-key batch starts between the claim and its settling
            with psycopg.connect(PG_URL, autocommit=True) as watch:
                for _ in range(150):  # until it waits for a row lock
                    cur = watch.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query LIKE %s",
                        (f"%{store.table}%",),
                    )
                    if cur.fetchone() != (0,):
                        break
                    time.sleep(0.02)
        return real(*args, **kwargs)

    monkeypatch.setattr(atomic, "settle_claim", between)
    out = sets.process_batch(batch, lambda p, tx: "sets")
    worker.join(30)
    assert [(o.result, o.replayed) for o in out] == [("sets", False), ("sets", False)]
    assert len(other) == 1 and isinstance(other[0], list), other
    assert [(o.result, o.replayed) for o in other[0]] == [("sets", True), ("sets", True)]


def test_events_are_those_of_the_per_key_path(pg_store_factory: StoreFactory) -> None:
    """Listeners see the same events from a set-based batch as from one key at a time:
    completed, replayed, failed (before and after writing), mismatched, dead."""
    store = pg_store_factory()
    store.migrate()
    business_table(store)
    batch = [
        ("a", {"id": "a"}),
        ("b", {"id": "b", "early": True}),
        ("a", {"id": "a"}),
        ("done", {"id": "done"}),
        ("mismatch", {"id": "mismatch", "v": 2}),
        ("dead", {"id": "dead"}),
    ]
    rerun = [("c", {"id": "c", "boom": True}), ("e", {"id": "e"})]  # c fails after writing
    seen: dict[str, list[tuple[Any, ...]]] = {}
    for consumer, make in (("sets", onceonly.Inbox), ("keys", per_key)):
        stage(store, consumer)
        events: list[onceonly.Event] = []
        inbox = make(store, consumer, max_attempts=2, listeners=[events.append])
        inbox.process_batch(batch, ledger_handler(store))
        inbox.process_batch(rerun, ledger_handler(store))
        seen[consumer] = sorted(
            (e.kind.value, e.key, e.attempt, e.error, e.handler_seconds is not None) for e in events
        )
    assert seen["sets"] == seen["keys"]
    assert ("completed", "a", 1, None, True) in seen["sets"]
    assert ("replayed", "a", None, None, False) in seen["sets"]


def test_a_handler_that_commits_leaves_the_earlier_messages_completed(
    pg_store_factory: StoreFactory,
) -> None:
    """b's handler sends COMMIT: a (completed before b ran) stays completed and replays;
    b's run is a counted failure, never a success; c never ran: its claim, which the
    COMMIT committed too, is given back uncounted (spec §1.6a)."""
    store = pg_store_factory()
    store.migrate()
    count = business_table(store)
    inbox = onceonly.Inbox(store, "billing")
    table = f"{store.table}_ledger"

    def handler(payload: Any, tx: onceonly.Tx) -> str:
        tx.execute(f"INSERT INTO {table} (id, amount) VALUES (?, 1)", (payload,))
        if payload == "b":
            tx.execute("COMMIT")
        return payload

    batch = [(k, k) for k in "abc"]
    with pytest.raises(onceonly.TransactionEnded):
        inbox.process_batch(batch, handler)
    a, b = record(store, "billing", "a"), record(store, "billing", "b")
    assert (a.state, b.state, b.attempts) == (State.COMPLETED, State.FAILED, 1)
    c = record(store, "billing", "c")
    assert c is None or (c.state, c.attempts) == (State.FAILED, 0)
    assert count() == 2  # a's and b's inserts, committed by b's COMMIT

    def plain(payload: Any, tx: onceonly.Tx) -> str:
        return payload

    out = inbox.process_batch(batch, plain)
    assert [(o.replayed, o.attempt) for o in out] == [(True, 1), (False, 2), (False, 1)]


def test_batches_lock_in_one_order_whatever_the_collation() -> None:
    """On a database whose collation puts 'a' before 'B' (ICU en-US), a set-based batch
    and a per-key one (``precount_attempts``) over the same keys lock them in the same
    (code-point) order: both end in about the handler's time (found black-box: the
    set-based statement locked in the collation's order, the per-key batch in Python's,
    and the cycle through the precount's own connection stalled both for ``wait``)."""
    name = f"icu_{uuid.uuid4().hex[:10]}"
    base = PG_URL.rsplit("/", 1)[0]
    with psycopg.connect(PG_URL, autocommit=True) as c:
        c.execute(
            f"CREATE DATABASE {name} LOCALE_PROVIDER icu ICU_LOCALE 'en-US' "
            "LOCALE 'C.UTF-8' TEMPLATE template0"
        )
    store = onceonly.open_store(f"{base}/{name}", outbox_table=None)
    try:
        store.migrate()
        per_key_inbox = onceonly.Inbox(store, consumer="c", wait=10.0, precount_attempts=True)
        set_based = onceonly.Inbox(store, consumer="c", wait=10.0)
        took: dict[str, float] = {}
        errors: list[BaseException] = []

        def handler(payload: Any, tx: onceonly.Tx) -> Any:
            if tx.key == "B":
                time.sleep(1.0)  # the per-key batch holds B's claim meanwhile
            return payload

        def run(label: str, inbox: onceonly.Inbox, delay: float) -> None:
            time.sleep(delay)
            started = time.monotonic()
            try:
                outcomes = inbox.process_batch([("B", 1), ("a", 1)], handler)
                errors.extend(o.error for o in outcomes if o.error is not None)
            except BaseException as exc:
                errors.append(exc)
            took[label] = time.monotonic() - started

        threads = [
            threading.Thread(target=run, args=("per_key", per_key_inbox, 0.0)),
            threading.Thread(target=run, args=("set_based", set_based, 0.3)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert took["per_key"] < 5.0 and took["set_based"] < 5.0, took  # not `wait`
    finally:
        store.close()
        with psycopg.connect(PG_URL, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
