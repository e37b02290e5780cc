# SPDX-License-Identifier: MIT
"""The public held-claim API of leased mode (docs/modes.md), on every store: acquire,
finish, fail, release, renew, current, and the ``with`` / ``async with`` block."""

from __future__ import annotations

import time
from typing import Any

import pytest

import onceonly
from onceonly._core.state import State


def runner(store: Any, **options: Any) -> onceonly.LeasedRunner:
    return onceonly.LeasedRunner(store, scope="held", **options)


def test_finish_then_replay(leased_store: Any) -> None:
    """A finished claim replays its result; the heartbeat stops with the outcome."""
    r = runner(leased_store)
    claim = r.acquire("k1", "fp")
    assert isinstance(claim, onceonly.Claim) and claim.attempt == 1
    assert claim.renew() is True
    done = claim.finish({"n": 1})
    assert done.state is State.COMPLETED and claim.ended
    again = r.acquire("k1", "fp")
    assert isinstance(again, onceonly.Replay) and r.replay(again.record) == {"n": 1}
    with pytest.raises(RuntimeError):
        claim.release("twice")  # a claim is ended once


def test_fail_counts_release_does_not(leased_store: Any) -> None:
    """fail() counts an attempt (dead at max_attempts); release() gives the key back free."""
    r = runner(leased_store, max_attempts=2)
    first = r.acquire("k2", None)
    assert isinstance(first, onceonly.Claim)
    assert first.release("not now") is True
    second = r.acquire("k2", None)
    assert isinstance(second, onceonly.Claim) and second.attempt == 1
    assert second.fail(RuntimeError("boom")) is True
    third = r.acquire("k2", None)
    assert isinstance(third, onceonly.Claim) and third.attempt == 2
    third.fail(RuntimeError("boom again"))
    with pytest.raises(onceonly.DeadLettered):
        r.acquire("k2", None)


def test_release_unbound_lets_the_next_claim_bind_its_own_fingerprint(leased_store: Any) -> None:
    """release(unbind=True) forgets the fingerprint: the next claim binds its own, and
    a third with yet another is a mismatch again; a plain release keeps it."""
    r = runner(leased_store)
    kept = r.acquire("k4", "fp-a")
    assert isinstance(kept, onceonly.Claim) and kept.release("kept") is True
    with pytest.raises(onceonly.PayloadMismatch):
        r.acquire("k4", "fp-b")
    first = r.acquire("k5", "fp-a")
    assert isinstance(first, onceonly.Claim)
    assert first.release("sent elsewhere", unbind=True) is True
    second = r.acquire("k5", "fp-b")
    assert isinstance(second, onceonly.Claim) and second.record.fingerprint == "fp-b"
    second.finish({"n": 2})
    with pytest.raises(onceonly.PayloadMismatch):
        r.acquire("k5", "fp-a")
    again = r.acquire("k5", "fp-b")
    assert isinstance(again, onceonly.Replay) and r.replay(again.record) == {"n": 2}


def test_with_block_fails_on_error_and_releases_without_outcome(leased_store: Any) -> None:
    """The with block fails the claim on an exception, releases it when left without one."""
    r = runner(leased_store, max_attempts=5)
    got = r.acquire("k3", None)
    assert isinstance(got, onceonly.Claim)
    with pytest.raises(ValueError), got:
        raise ValueError("bad")
    assert got.ended
    again = r.acquire("k3", None)
    assert isinstance(again, onceonly.Claim) and again.attempt == 2
    with again:
        pass
    last = r.acquire("k3", None)
    assert isinstance(last, onceonly.Claim) and last.attempt == 2  # released: not counted


def test_finish_after_a_takeover_is_lease_lost(leased_store: Any) -> None:
    """A holder whose lease lapsed and was taken over gets LeaseLost from finish();
    current() shows the winner's outcome."""
    slow = runner(leased_store, lease=0.3)
    stalled = slow.claim("k4", None)  # no heartbeat: it stalls
    assert isinstance(stalled, onceonly.Claim)
    time.sleep(0.5)
    winner = slow.acquire("k4", None)
    assert isinstance(winner, onceonly.Claim) and winner.attempt == 2
    winner.finish("winner")
    with pytest.raises(onceonly.LeaseLost):
        stalled.finish("loser")
    record = stalled.current()
    assert record is not None and record.state is State.COMPLETED
    assert slow.replay(record) == "winner"


async def test_async_held_claim(leased_async_store: Any) -> None:
    """The async twin: acquire, async with, finish, replay."""
    r = onceonly.AsyncLeasedRunner(leased_async_store, scope="held-async")
    got = await r.acquire("k1", None)
    assert isinstance(got, onceonly.AsyncClaim)
    async with got as claim:
        assert await claim.renew()
        await claim.finish([1, 2])
    again = await r.acquire("k1", None)
    assert isinstance(again, onceonly.Replay) and r.replay(again.record) == [1, 2]
