# SPDX-License-Identifier: MIT
"""@idempotent (leased mode) behaviour over every store (docs/spec.md §1)."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest

import onceonly
from onceonly._core.state import Policy
from onceonly.inbox import LeasedRunner


@dataclasses.dataclass(frozen=True)
class Receipt:
    order: str
    amount: int


def test_runs_once_and_replays(leased_store: Any) -> None:
    """The function runs once per key; duplicates return the stored result."""
    calls: list[int] = []

    @onceonly.idempotent(leased_store, key=lambda order, amount: f"charge:{order}", scope="charge")
    def charge(order: str, amount: int) -> dict[str, int]:
        calls.append(amount)
        return {"amount": amount}

    assert charge("o-1", 5) == {"amount": 5}
    assert charge("o-1", 5) == {"amount": 5}
    assert charge("o-2", 7) == {"amount": 7}
    assert calls == [5, 7]


def test_dataclass_results_replay_as_dataclasses(leased_store: Any) -> None:
    """A dataclass return annotation rebuilds the replayed result as that dataclass."""

    @onceonly.idempotent(leased_store, key=lambda order: order, scope="charge")
    def charge(order: str) -> Receipt:
        return Receipt(order, 5)

    assert charge("o-1") == Receipt("o-1", 5)
    assert charge("o-1") == Receipt("o-1", 5)


def test_other_arguments_same_key_is_mismatch(leased_store: Any) -> None:
    """The same key with other arguments raises PayloadMismatch."""

    @onceonly.idempotent(leased_store, key=lambda order, amount: order, scope="charge")
    def charge(order: str, amount: int) -> int:
        return amount

    charge("o-1", 5)
    with pytest.raises(onceonly.PayloadMismatch):
        charge("o-1", 6)


def test_failure_propagates_and_retries(leased_store: Any) -> None:
    """A raising function re-raises; the next call runs it again."""
    calls: list[int] = []

    @onceonly.idempotent(leased_store, key=lambda n: str(n), scope="flaky", max_attempts=2)
    def flaky(n: int) -> int:
        calls.append(onceonly.current_claim().attempt)
        raise KeyError("nope")

    with pytest.raises(KeyError):
        flaky(1)
    with pytest.raises(KeyError):
        flaky(1)
    with pytest.raises(onceonly.DeadLettered):
        flaky(1)
    assert calls == [1, 2]


def test_live_claim_is_in_flight_for_others(leased_store_factory: Any) -> None:
    """While one call runs, another with the same key waits, then replays."""
    store = leased_store_factory()
    store.migrate()
    started, release = threading.Event(), threading.Event()

    @onceonly.idempotent(store, key=lambda: "k", scope="slow", lease=5, wait=0.2)
    def slow() -> str:
        started.set()
        release.wait(5)
        return "done"

    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(slow()))
    t.start()
    assert started.wait(5)
    with pytest.raises(onceonly.InFlight) as info:
        slow()
    assert info.value.retry_after is not None and 0 < info.value.retry_after <= 5
    release.set()
    t.join(5)
    assert out == ["done"] and slow() == "done"


def _runner(store: Any, lease: float = 0.3, scope: str = "fn") -> LeasedRunner:
    return LeasedRunner(store, scope=scope, policy=Policy(lease, 5), ttl=None, wait=0.05)


def test_lapsed_lease_is_reclaimed_and_stale_completion_is_fenced(leased_store: Any) -> None:
    """A claim whose lease lapsed is taken over; the stale holder cannot complete."""
    runner = _runner(leased_store)
    stale = runner.claim("k", None)
    assert isinstance(stale, onceonly.Claim)
    time.sleep(0.4)  # the lease lapses on the store's clock (no heartbeat here)
    result, replayed, attempt = runner.run("k", None, lambda: "winner")
    assert (result, replayed, attempt) == ("winner", False, 2)
    with leased_store.session() as s:
        from onceonly._core.state import Expect, complete_write

        assert (
            s.update(
                "fn", "k", Expect.holder(stale.token), complete_write(stale.record, '"stale"', None)
            )
            is None
        )
    assert runner.run("k", None, lambda: "again") == ("winner", True, 2)


def test_heartbeat_keeps_a_long_call_alive(leased_store: Any) -> None:
    """A call longer than its lease keeps the claim through renewal."""
    calls: list[int] = []

    @onceonly.idempotent(leased_store, key=lambda: "long", scope="long", lease=0.3, wait=0.05)
    def long_call() -> str:
        calls.append(1)
        time.sleep(1.0)
        return "finished"

    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(long_call()))
    t.start()
    time.sleep(0.6)  # two leases later: renewed, so a duplicate is still in flight
    with pytest.raises(onceonly.InFlight):
        long_call()
    t.join(5)
    assert out == ["finished"] and calls == [1]


def test_checkpoints_survive_a_lapsed_claim(leased_store: Any) -> None:
    """Checkpoints saved under a claim are seen by the worker that reclaims it."""
    runner = _runner(leased_store)
    first = runner.claim("k", None)
    assert isinstance(first, onceonly.Claim)
    first.checkpoint("reserved", {"sku": "A", "qty": 2})
    assert first.checkpoints == {"reserved": {"sku": "A", "qty": 2}}
    time.sleep(0.4)
    second = runner.claim("k", None)
    assert isinstance(second, onceonly.Claim)
    assert second.attempt == 2
    assert second.checkpoints == {"reserved": {"sku": "A", "qty": 2}}
    with pytest.raises(onceonly.LeaseLost):
        first.checkpoint("charged", {"id": "ch_1"})


def test_current_claim_outside_a_call_is_an_error() -> None:
    """current_claim() outside an idempotent call raises LookupError."""
    with pytest.raises(LookupError):
        onceonly.current_claim()


def test_round_trips_new_key_and_replay(sql_store: Any) -> None:
    """Leased mode costs at most 2 store operations per new key and 1 per replay."""
    ops: list[str] = []
    session_cls = type(_open_session(sql_store))
    names = ["claim", "get", "update", "insert", "renew", "save_checkpoint"]
    originals = {n: getattr(session_cls, n) for n in names}

    depth = [0]

    def spy(name: str) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if depth[0] == 0:  # count calls from onceonly, not a store's own internals
                ops.append(name)
            depth[0] += 1
            try:
                return originals[name](self, *args, **kwargs)
            finally:
                depth[0] -= 1

        return wrapper

    @onceonly.idempotent(sql_store, key=lambda n: str(n), scope="double", lease=30)
    def f(n: int) -> int:
        return n * 2

    try:
        for n in names:
            setattr(session_cls, n, spy(n))
        assert f(21) == 42
        new_ops = list(ops)
        ops.clear()
        assert f(21) == 42
        replay_ops = list(ops)
    finally:
        for n, fn in originals.items():
            setattr(session_cls, n, fn)
    assert new_ops == ["claim", "update"]
    assert replay_ops == ["claim"]


def _open_session(store: Any) -> Any:
    with store.session() as s:
        return s


def test_sync_function_needs_sync_store(tmp_path: Any) -> None:
    """Mixing an async store with a sync function is a ConfigurationError."""
    astore = onceonly.open_async_store(f"sqlite:///{tmp_path / 'a.db'}")
    with pytest.raises(onceonly.ConfigurationError):

        @onceonly.idempotent(astore, key=lambda: "k")
        def f() -> None:
            return None
