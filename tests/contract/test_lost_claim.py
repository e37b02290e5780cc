# SPDX-License-Identifier: MIT
"""A claim whose reply was lost is not an attempt, on every store (docs/spec.md §2.3.1).

The store below commits the claim and then fails as if the reply never arrived
(:class:`StoreUnavailable` after the session's commit). The caller asks again under
the same token and takes its own claim back: the function runs, the attempt is not
counted, and with ``max_attempts`` reached by that phantom the key is not dead.
``tests/faults/test_lost_claim_reply.py`` does the same through a real cut connection.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import onceonly
from onceonly._core.state import Policy, State
from onceonly.errors import StoreUnavailable
from onceonly.inbox import LeasedRunner


class LosingReplies:
    """A store whose ``lose``-th session commits and then reports the store gone; the
    ``down`` sessions after it fail before doing anything (the store still away)."""

    def __init__(self, store: Any, lose: int = 1, down: int = 0) -> None:
        self._store = store
        self.lose = lose
        self.down = down
        self.sessions = 0
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    @contextmanager
    def session(self) -> Iterator[Any]:
        self.sessions += 1
        n = self.sessions
        if self.lose < n <= self.lose + self.down:
            raise StoreUnavailable("the store is still away")
        with self._store.session() as s:
            yield s
        if n == self.lose:
            self.lost += 1
            raise StoreUnavailable("the connection dropped before the reply arrived")


def _record(store: Any, key: str) -> Any:
    with store.session() as s:
        return s.get("fn", key).record


def test_a_new_claim_whose_reply_was_lost_runs_uncounted(leased_store_factory: Any) -> None:
    """max_attempts=1: the first claim's reply is lost; the call still runs, attempt 1."""
    store = leased_store_factory()
    store.migrate()
    runs: list[int] = []
    faulty = LosingReplies(store)
    runner = LeasedRunner(faulty, scope="fn", policy=Policy(30.0, 1), ttl=None, wait=1.0)
    result, replayed, attempt = runner.run("k", None, lambda: runs.append(1) or "ok")
    assert faulty.lost == 1
    assert (result, replayed, attempt, runs) == ("ok", False, 1, [1])
    record = _record(store, "k")
    assert record.state is State.COMPLETED and record.attempts == 0


def test_a_retake_whose_reply_was_lost_is_not_counted(leased_store_factory: Any) -> None:
    """max_attempts=2: run 1 fails; run 2's claim reply is lost; run 2 still runs."""
    store = leased_store_factory()
    store.migrate()
    runs: list[int] = []

    def fn() -> str:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("first run fails")
        return "ok"

    policy = Policy(30.0, 2)
    with pytest.raises(RuntimeError):
        LeasedRunner(store, scope="fn", policy=policy, ttl=None, wait=1.0).run("k", None, fn)
    faulty = LosingReplies(store)
    runner = LeasedRunner(faulty, scope="fn", policy=policy, ttl=None, wait=1.0)
    result, _, attempt = runner.run("k", None, fn)
    assert faulty.lost == 1
    assert (result, attempt, len(runs)) == ("ok", 2, 2)
    record = _record(store, "k")
    assert record.state is State.COMPLETED and record.attempts == 1


def test_the_next_call_takes_back_a_claim_the_last_one_gave_up_on(
    leased_store_factory: Any,
) -> None:
    """The store stays away past the call's budget: StoreUnavailable; the next call of
    the key in this process runs it, uncounted, although the claim's lease is live."""
    store = leased_store_factory()
    store.migrate()
    runs: list[int] = []
    faulty = LosingReplies(store, down=1000)
    runner = LeasedRunner(faulty, scope="fn", policy=Policy(30.0, 1), ttl=None, wait=0.05)
    with pytest.raises(StoreUnavailable):
        runner.run("k", None, lambda: runs.append(1) or "ok")
    assert runs == []
    claimed = _record(store, "k")
    assert claimed.state is State.IN_PROGRESS  # committed: a live claim nobody knows of
    faulty.down = 0
    result, _, attempt = runner.run("k", None, lambda: runs.append(1) or "ok")
    assert (result, attempt, runs) == ("ok", 1, [1])
    record = _record(store, "k")
    assert record.state is State.COMPLETED and record.attempts == 0


def test_a_leased_inbox_takes_back_its_lost_claim(leased_store_factory: Any) -> None:
    """The leased inbox counts the same way: a lost claim reply is no attempt."""
    store = leased_store_factory()
    store.migrate()
    faulty = LosingReplies(store)
    inbox = onceonly.Inbox(faulty, consumer="fn", mode="leased", max_attempts=1, wait=1.0)
    seen: list[int] = []

    def handler(payload: Any, tx: Any) -> str:
        seen.append(tx.attempt)
        return "done"

    outcome = inbox.process("k", {"n": 1}, handler)
    assert faulty.lost == 1
    assert (outcome.result, outcome.replayed, outcome.attempt, seen) == ("done", False, 1, [1])
    record = _record(store, "k")
    assert record.state is State.COMPLETED and record.attempts == 0
