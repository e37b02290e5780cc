# SPDX-License-Identifier: MIT
"""Replays read first (spec §1.2a) on real PostgreSQL, with a writer interleaved: a
replay comes only from a committed, completed, unexpired record, never from one a
concurrent writer could still change (uncommitted, in progress, failed, expired)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly._core.fingerprint import fingerprint
from onceonly._core.state import Expect, State, Write, complete_write
from tests.conftest import StoreFactory
from tests.stores.test_postgres_specific import round_trips

SCOPE = "billing"


@pytest.fixture(params=["plain", "partitioned"])
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """The plain and the time-partitioned table."""
    f = StoreFactory("pgpart" if request.param == "partitioned" else "postgres", tmp_path)
    yield f
    f.close()


class Runs:
    """A handler that counts its runs."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, payload: Any, tx: onceonly.Tx) -> str:
        self.count += 1
        return f"ran:{payload}"


def primed(factory: StoreFactory, **options: Any) -> tuple[Any, onceonly.Inbox, Runs]:
    """A store and an inbox whose recent deliveries were all replays: it reads first
    (checked: a replay is one round trip)."""
    store = factory(min_size=1, max_size=1)
    store.migrate()
    inbox = onceonly.Inbox(store, SCOPE, **options)
    runs = Runs()
    inbox.process("warm", "warm", runs)
    for _ in range(24):  # the share of replays is then about 0.8
        assert inbox.process("warm", "warm", runs).replayed
    conn = store.pool.getconn()
    store.pool.putconn(conn)
    assert round_trips(conn, lambda: inbox.process("warm", "warm", runs)) == 1
    return store, inbox, runs


def held_open(store: Any, key: str, payload: Any, ended: threading.Event, commit: bool) -> None:
    """A writer: claims ``key`` and completes it in one transaction, then keeps it open
    until ``ended`` is set, and commits (``commit``) or rolls back."""

    class RolledBack(Exception):
        pass

    try:
        with store.transaction() as s:
            write = Write(State.IN_PROGRESS, 77, fingerprint(payload), 0)
            claimed = s.claim(SCOPE, key, write)
            assert claimed.inserted and claimed.record is not None
            done = s.update(
                SCOPE,
                key,
                Expect(77, State.IN_PROGRESS),
                complete_write(claimed.record, '"writer"', 3600.0),
            )
            assert done is not None
            ended.wait(10)
            if not commit:
                raise RolledBack
    except RolledBack:
        pass


def started(pool: ThreadPoolExecutor, fn: Any, *args: Any) -> Future[Any]:
    future = pool.submit(fn, *args)
    time.sleep(0.3)  # the writer's claim and completion are out, uncommitted
    return future


@pytest.mark.parametrize("commit", [True, False], ids=["commits", "rolls-back"])
def test_an_uncommitted_completion_is_never_replayed(factory: StoreFactory, commit: bool) -> None:
    """A writer's completion, not yet committed: the delivery reading first does not
    see it and its claim waits for the writer. Committed, it is replayed; rolled back,
    the delivery runs the handler itself."""
    store, inbox, runs = primed(factory)
    ended = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        writer = started(pool, held_open, store, "k", "p", ended, commit)
        reader = pool.submit(inbox.process, "k", "p", runs)
        time.sleep(0.5)
        assert not reader.done(), "replayed (or ran) while the writer's transaction was open"
        ended.set()
        writer.result(10)
        outcome = reader.result(10)
    if commit:
        assert outcome.replayed and outcome.result == "writer"
        assert runs.count == 1  # the warm-up only
    else:
        assert not outcome.replayed and outcome.result == "ran:p"
        assert runs.count == 2


def test_a_failed_run_is_retried_not_replayed(factory: StoreFactory) -> None:
    """A key whose last run failed (committed ``failed``): read first, it is claimed and
    run again, never replayed."""
    store, inbox, runs = primed(factory)

    def fails(payload: Any, tx: onceonly.Tx) -> None:
        raise ValueError("boom")

    writer = onceonly.Inbox(store, SCOPE)
    with pytest.raises(ValueError):
        writer.process("k", "p", fails)
    outcome = inbox.process("k", "p", runs)
    assert not outcome.replayed and outcome.result == "ran:p" and outcome.attempt == 2


def test_an_expired_completion_is_run_again(factory: StoreFactory) -> None:
    """A completed record past its expiry (on the store's clock) behaves as absent."""
    store, inbox, runs = primed(factory)  # the writer's ttl is the record's expiry
    writer = onceonly.Inbox(store, SCOPE, ttl=0.2)
    assert writer.process("k", "p", lambda p, tx: "first").result == "first"
    time.sleep(0.4)
    outcome = inbox.process("k", "p", runs)
    assert not outcome.replayed and outcome.result == "ran:p"


def test_a_reused_key_with_another_payload_is_a_mismatch(factory: StoreFactory) -> None:
    """Read first, another payload's record is not replayed: the claim says mismatch."""
    _store, inbox, runs = primed(factory)
    inbox.process("k", "p", runs)
    with pytest.raises(onceonly.PayloadMismatch):
        inbox.process("k", "other", runs)


def test_replays_race_a_writer_that_completes_fails_and_rolls_back(
    factory: StoreFactory,
) -> None:
    """Readers replay while a writer runs keys that fail, roll back and complete, in
    turn: every replay is a completed, committed run of its key, and no key runs twice
    once completed."""
    store = factory(min_size=3, max_size=3)
    store.migrate()
    completed: dict[str, str] = {}
    lock = threading.Lock()
    stop = threading.Event()

    class Undone(Exception):
        pass

    def writer() -> None:
        inbox = onceonly.Inbox(store, SCOPE, uncounted_errors=(Undone,))
        for i in range(40):
            key = f"w{i}"

            def fails(payload: Any, tx: onceonly.Tx) -> None:
                raise ValueError("fails")

            def undone(payload: Any, tx: onceonly.Tx) -> None:
                raise Undone

            def completes(payload: Any, tx: onceonly.Tx, key: str = key) -> str:
                with lock:
                    assert key not in completed, "a completed key ran again"
                    completed[key] = f"writer:{key}"
                return f"writer:{key}"

            for handler in (fails, undone, completes):
                with contextlib.suppress(ValueError, Undone, onceonly.InFlight):
                    inbox.process(key, key, handler)

    def writes() -> None:
        try:
            writer()
        finally:
            stop.set()

    def reader() -> int:
        inbox = onceonly.Inbox(store, SCOPE)
        replays = 0
        i = 0
        while not stop.is_set():
            key = f"w{i % 40}"
            i += 1

            def late(payload: Any, tx: onceonly.Tx, key: str = key) -> str:
                with lock:
                    assert key not in completed, "a completed key ran again"
                    completed[key] = f"reader:{key}"
                return f"reader:{key}"

            try:
                outcome = inbox.process(key, key, late)
            except onceonly.InFlight:
                continue
            if outcome.replayed:
                replays += 1
                with lock:
                    assert outcome.result == completed[key]
        return replays

    with ThreadPoolExecutor(3) as pool:
        readers = [pool.submit(reader) for _ in range(2)]
        pool.submit(writes).result(60)
        assert sum(r.result(60) for r in readers) > 0
