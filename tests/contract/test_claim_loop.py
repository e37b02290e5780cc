# SPDX-License-Identifier: MIT
"""The one claim loop every surface shares (``onceonly.inbox._claim``): the same answers
in atomic and leased mode, the same wait for a key held elsewhere, and
``uncounted_errors`` for runs that are no failure (docs/spec.md §1.3, §2.3)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import onceonly
from onceonly._core.state import Policy
from onceonly.errors import InFlight, PayloadMismatch
from onceonly.inbox import LeasedRunner


class Later(Exception):
    """What a framework raises for "run me again later": no failure of the message."""


class _CountingSession:
    def __init__(self, session: Any, counts: dict[str, int]) -> None:
        self._session = session
        self._counts = counts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def claim(self, *args: Any) -> Any:
        self._counts["claim"] += 1
        return self._session.claim(*args)


class Counting:
    """A store that counts the claims sent through its transactions and sessions."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.counts = {"claim": 0}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    @contextmanager
    def session(self) -> Iterator[Any]:
        with self._store.session() as s:
            yield _CountingSession(s, self.counts)

    @contextmanager
    def transaction(self, connection: Any = None, *, lock_wait: float = 5.0) -> Iterator[Any]:
        with self._store.transaction(connection, lock_wait=lock_wait) as s:
            yield _CountingSession(s, self.counts)


def _attempts(store: Any, scope: str, key: str) -> int | None:
    with store.session() as s:
        record = s.get(scope, key).record
    return None if record is None else record.attempts


@pytest.mark.parametrize("mode", ["atomic", "leased"])
def test_a_held_key_is_looked_at_less_often_as_the_wait_goes_on(store: Any, mode: str) -> None:
    """Waiting for a live claim elsewhere, both modes look again after 10 ms, doubling up
    to 0.5 s: about 8 looks in a second's wait, not one every 50 ms."""
    holder = LeasedRunner(store, scope="billing", policy=Policy(30.0, 5))
    held = holder.acquire("k", None)
    assert isinstance(held, onceonly.Claim)
    counting = Counting(store)
    inbox = onceonly.Inbox(counting, consumer="billing", wait=1.0, mode=mode)
    try:
        with pytest.raises(InFlight):
            inbox.process("k", {"n": 1}, lambda payload, tx: "never")
    finally:
        held.release("test over")
    assert 2 <= counting.counts["claim"] <= 10


@pytest.mark.parametrize("mode", ["atomic", "leased"])
def test_uncounted_errors_give_the_key_back_without_an_attempt(store: Any, mode: str) -> None:
    """A run that raises one of ``uncounted_errors`` counts no attempt (a precounted one is
    given back): with ``max_attempts=1`` the key still runs after three of them."""
    inbox = onceonly.Inbox(
        store,
        consumer="billing",
        max_attempts=1,
        uncounted_errors=(Later,),
        precount_attempts=True,
        mode=mode,
    )

    def later(payload: Any, tx: Any) -> str:
        raise Later("not now")

    for _ in range(3):
        with pytest.raises(Later):
            inbox.process("k", {"n": 1}, later)
        assert _attempts(store, "billing", "k") in (None, 0)
    outcome = inbox.process("k", {"n": 1}, lambda payload, tx: "done")
    assert (outcome.result, outcome.replayed, outcome.attempt) == ("done", False, 1)


def test_uncounted_errors_of_a_leased_runner(leased_store: Any) -> None:
    """``LeasedRunner(uncounted_errors=...)``: such a run gives its claim back uncounted."""
    runner = LeasedRunner(
        leased_store, scope="fn", policy=Policy(30.0, 1), uncounted_errors=(Later,)
    )

    def later() -> str:
        raise Later("not now")

    for _ in range(3):
        with pytest.raises(Later):
            runner.run("k", None, later)
        assert _attempts(leased_store, "fn", "k") == 0
    assert runner.run("k", None, lambda: "done") == ("done", False, 1)


def test_a_reused_key_is_the_same_error_in_both_modes(sql_store: Any) -> None:
    """Another payload under a used key raises one PayloadMismatch, whatever the mode."""
    messages = []
    for mode in ("atomic", "leased"):
        inbox = onceonly.Inbox(sql_store, consumer=f"c-{mode}", mode=mode)
        inbox.process("k", {"n": 1}, lambda payload, tx: "done")
        with pytest.raises(PayloadMismatch) as caught:
            inbox.process("k", {"n": 2}, lambda payload, tx: "done")
        messages.append(caught.value.message)
    assert messages[0] == messages[1]
    assert "another payload" in messages[0]
