# SPDX-License-Identifier: MIT
"""The SQLite store's pending claim (``SQLiteSession``): in its own ``BEGIN IMMEDIATE``
transaction a claim of an absent key is a read, and the record is written once, by the
insert that stores its completion. Interleaved actors: a duplicate and a reader while the
first delivery's transaction is open, a process killed while its claim is pending or
after its completion's insert, and every other use of the session writing the claim
first.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly._core.state import Expect, State, Write
from onceonly.stores.sqlite import SQLiteStore


def open_with_ledger(path: Path) -> Any:
    store: Any = onceonly.open_store(f"sqlite:///{path}", migrate=True)
    with store.transaction() as s:
        s.execute("CREATE TABLE IF NOT EXISTS ledger (id TEXT NOT NULL)")
    return store


def rows(store: Any, sql: str) -> list[tuple[Any, ...]]:
    with store.session() as s:
        return [tuple(r) for r in s.execute(sql).fetchall()]


@pytest.mark.timeout(30)
def test_a_duplicate_and_a_reader_during_the_first_transaction(tmp_path: Path) -> None:
    """While the first delivery's handler runs (its claim pending), a reader sees no
    record, a duplicate that may not wait is in flight, and one that waits replays it."""
    first_store = open_with_ledger(tmp_path / "db.sqlite")
    other = open_with_ledger(tmp_path / "db.sqlite")  # another store on the file
    inside, release = threading.Event(), threading.Event()
    runs: list[str] = []

    def handler(payload: str, tx: onceonly.Tx) -> str:
        runs.append(payload)
        tx.execute("INSERT INTO ledger (id) VALUES (?)", (payload,))
        inside.set()
        assert release.wait(10)
        return "done"

    first = threading.Thread(
        target=lambda: onceonly.Inbox(first_store, "c").process("k", "k", handler)
    )
    first.start()
    try:
        assert inside.wait(10)
        # a reader (autocommit, WAL): the uncommitted claim is invisible
        assert rows(other, "SELECT key FROM onceonly_records") == []
        with other.session() as session:
            assert session.get("c", "k").record is None
        with pytest.raises(onceonly.InFlight):
            onceonly.Inbox(other, "c", wait=0.2).process("k", "k", handler)
        waiting: list[Any] = []
        duplicate = threading.Thread(
            target=lambda: waiting.append(
                onceonly.Inbox(other, "c", wait=10).process("k", "k", handler)
            )
        )
        duplicate.start()
        time.sleep(0.2)
        assert not waiting  # it waits on the first transaction's write lock
    finally:
        release.set()
        first.join(10)
    duplicate.join(10)
    assert waiting[0].replayed and waiting[0].result == "done"
    assert runs == ["k"]
    assert rows(other, "SELECT id FROM ledger") == [("k",)]
    assert rows(other, "SELECT state, token > 0 FROM onceonly_records") == [("completed", 1)]
    first_store.close()
    other.close()


@pytest.mark.timeout(30)
def test_threads_claiming_the_same_keys_run_each_once(tmp_path: Path) -> None:
    """Four threads (two stores on one file) deliver the same 30 keys: one run each."""
    stores = [open_with_ledger(tmp_path / "db.sqlite") for _ in range(2)]
    lock = threading.Lock()
    runs: list[str] = []

    def handler(payload: str, tx: onceonly.Tx) -> str:
        with lock:
            runs.append(payload)
        tx.execute("INSERT INTO ledger (id) VALUES (?)", (payload,))
        return payload

    def worker(i: int) -> None:
        inbox = onceonly.Inbox(stores[i % 2], "c", wait=20)
        for n in range(30):
            assert inbox.process(f"k{n}", f"k{n}", handler).result == f"k{n}"

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(25)
    assert sorted(runs) == sorted(f"k{n}" for n in range(30))
    assert rows(stores[0], "SELECT count(*), count(DISTINCT id) FROM ledger") == [(30, 30)]
    states = rows(stores[0], "SELECT DISTINCT state FROM onceonly_records")
    assert states == [("completed",)]
    for store in stores:
        store.close()


CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    import onceonly
    from onceonly.stores.sqlite._store import SQLiteSession

    path, point, flag = sys.argv[1:4]
    store = onceonly.open_store(f"sqlite:///{path}")
    if point == "after_completion":
        original = SQLiteSession._complete_pending

        def complete(self, pending, write):
            got = original(self, pending, write)
            os.kill(os.getpid(), signal.SIGKILL)  # the completed row inserted, no COMMIT
            return got

        SQLiteSession._complete_pending = complete

    def handler(payload, tx):
        tx.execute("INSERT INTO ledger (id) VALUES (?)", (payload,))
        if point == "pending":
            open(flag, "w").close()
            time.sleep(30)  # killed by the test while its claim is pending
        return "first"

    onceonly.Inbox(store, "c").process("k", "k", handler)
    """
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("point", ["pending", "after_completion"])
def test_a_process_killed_in_its_transaction_leaves_nothing(tmp_path: Path, point: str) -> None:
    """A delivery SIGKILLed with its claim pending (a duplicate waiting on the lock), or
    after its completed record's insert but before COMMIT, leaves no record and no effect:
    the waiting duplicate runs the handler as the first attempt, once."""
    path = tmp_path / "db.sqlite"
    store = open_with_ledger(path)
    flag, log = tmp_path / "inside", tmp_path / "stderr"
    with log.open("w") as err:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path), point, str(flag)],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            stderr=err,
        )
    waiting: list[Any] = []
    duplicate = None
    try:
        if point == "pending":
            deadline = time.monotonic() + 20
            while not flag.exists():
                assert time.monotonic() < deadline and child.poll() is None
                time.sleep(0.02)
            duplicate = threading.Thread(
                target=lambda: waiting.append(
                    onceonly.Inbox(store, "c", wait=20).process("k", "k", lambda p, tx: second(tx))
                )
            )
            duplicate.start()
            time.sleep(0.3)
            assert not waiting  # blocked behind the child's transaction
            child.send_signal(signal.SIGKILL)
        assert child.wait(20) == -signal.SIGKILL, log.read_text()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if duplicate is None:
        assert rows(store, "SELECT key FROM onceonly_records") == []
        assert rows(store, "SELECT id FROM ledger") == []
        waiting.append(onceonly.Inbox(store, "c").process("k", "k", lambda p, tx: second(tx)))
    else:
        duplicate.join(20)
    outcome = waiting[0]
    assert (outcome.result, outcome.replayed, outcome.attempt) == ("second", False, 1)
    assert rows(store, "SELECT id FROM ledger") == [("second",)]
    assert rows(store, "SELECT state, result FROM onceonly_records") == [("completed", '"second"')]
    store.close()


def second(tx: onceonly.Tx) -> str:
    tx.execute("INSERT INTO ledger (id) VALUES (?)", ("second",))
    return "second"


def claim(session: Any, key: str, token: int = 7) -> Any:
    return session.claim("c", key, Write(State.IN_PROGRESS, token, "fp", 0))


def test_a_pending_claim_is_written_before_any_other_use(tmp_path: Path) -> None:
    """A read, an insert, another key's update or a commit of the session writes the
    pending claim first, as claimed: the session never answers from a row it skipped."""
    store = SQLiteStore(str(tmp_path / "db.sqlite"))
    store.migrate()
    with store.transaction() as s:
        assert claim(s, "a").inserted
        snap = s.get("c", "a")  # a read writes it first
        assert snap.record is not None and snap.record.state is State.IN_PROGRESS
        assert claim(s, "b").inserted
        assert s.insert("c", "b", Write(State.FAILED, 8, "fp", 1)) is None  # b is there
        assert claim(s, "c").inserted  # still pending at the commit
        assert (
            s.update("c", "b", Expect(99, State.IN_PROGRESS), Write(State.FAILED, 8, None, 1))
            is None
        )
        assert claim(s, "d").inserted  # a second claim writes d, then claims e as before
        assert claim(s, "e").inserted
        assert not claim(s, "e").inserted  # e is there (written as a plain claim)
        assert claim(s, "f").inserted  # written at the commit
    got = {
        r[0]: (r[1], r[2]) for r in rows(store, "SELECT key, state, token FROM onceonly_records")
    }
    assert got == dict.fromkeys("abcdef", ("in_progress", 7))
    store.close()


def test_a_pending_claim_whose_update_does_not_match_is_not_completed(tmp_path: Path) -> None:
    """An update expecting another version of the pending claim (another token, another
    state) changes nothing: the claim is written as claimed."""
    store = SQLiteStore(str(tmp_path / "db.sqlite"))
    store.migrate()
    with store.transaction() as s:
        assert claim(s, "a").inserted
        done = Write(State.COMPLETED, 7, "fp", 0, result="1", completed=True)
        assert s.update("c", "a", Expect(8, State.IN_PROGRESS), done) is None
        assert claim(s, "b").inserted
        assert s.update("c", "b", Expect(7, State.FAILED), done) is None
        assert claim(s, "e").inserted
        stored = s.update("c", "e", Expect(7, State.IN_PROGRESS), done)
        assert stored is not None and stored.state is State.COMPLETED
        assert stored.created_at <= stored.updated_at == stored.completed_at
    got = {r[0]: r[1] for r in rows(store, "SELECT key, state FROM onceonly_records")}
    assert got == {"a": "in_progress", "b": "in_progress", "e": "completed"}
    store.close()


def test_a_pending_claim_goes_with_an_ended_transaction(tmp_path: Path) -> None:
    """When the transaction ends under a pending claim (SQLite rolled it back), its
    completion stores nothing in autocommit: the claim is not ours any more."""
    store = SQLiteStore(str(tmp_path / "db.sqlite"))
    store.migrate()
    with pytest.raises(onceonly.TransactionEnded), store.transaction() as s:
        assert claim(s, "a").inserted
        conn = s.connection
        store._fences[id(conn)].armed = False  # as an automatic rollback would end it
        conn.rollback()
        done = Write(State.COMPLETED, 7, "fp", 0, result="1", completed=True)
        assert s.update("c", "a", Expect(7, State.IN_PROGRESS), done) is None
        assert claim(s, "b").inserted
        s.flush()
    assert rows(store, "SELECT key FROM onceonly_records") == []
    store.close()
