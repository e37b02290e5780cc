# SPDX-License-Identifier: MIT
"""``@idempotent`` fingerprints a call by its bound arguments, however they were passed.

Calls passing every parameter positionally are bound without ``Signature.bind`` (a fast
path); the fingerprint and the payload snapshot must be the same as when they are bound.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import pytest

import onceonly
from onceonly._runtime import Heartbeat, _Renewals


def test_positional_keyword_and_default_calls_are_one_call() -> None:
    """f(1, 2), f(1), f(a=1) and f(1, b=2) replay each other; f(1, 3) is a mismatch."""
    store = onceonly.open_store("memory://")
    runs: list[tuple[int, int]] = []

    @onceonly.idempotent(store, key=lambda a, b=2: f"k{a}", scope="tests.args")
    def f(a: int, b: int = 2) -> int:
        runs.append((a, b))
        return a + b

    assert [f(1, 2), f(1), f(a=1), f(1, b=2), f(b=2, a=1)] == [3] * 5
    assert runs == [(1, 2)]
    with pytest.raises(onceonly.PayloadMismatch):
        f(1, 3)


def test_signatures_with_star_args_still_bind() -> None:
    """*args / keyword-only / **kwargs signatures are bound the general way."""
    store = onceonly.open_store("memory://")
    runs: list[Any] = []

    @onceonly.idempotent(store, key=lambda *a, **k: "one", scope="tests.star")
    def g(a: int, *rest: int, flag: bool = False, **extra: Any) -> int:
        runs.append((a, rest, flag, extra))
        return a

    assert g(1, 2, 3, 4) == g(1, 2, 3, 4) == g(1, 2, 3, 4, flag=False) == 1
    assert len(runs) == 1
    with pytest.raises(onceonly.PayloadMismatch):
        g(1, 2, 3)


def test_a_sooner_heartbeat_wakes_the_scheduler() -> None:
    """A heartbeat due before the one the scheduler waits for still beats on time."""
    late = Heartbeat(60.0, lambda: True)
    late.start()
    beats: list[float] = []
    soon = Heartbeat(0.05, lambda: beats.append(time.monotonic()) is None)
    start = time.monotonic()
    soon.start()
    try:
        deadline = start + 5
        while not beats and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        soon.stop()
        late.stop()
    assert beats and beats[0] - start < 2.0


class _Counted(Heartbeat):
    __slots__ = ()
    ran: ClassVar[list[bool]] = []

    def beat_once(self) -> bool:
        _Counted.ran.append(self.stopped)
        return super().beat_once()


def test_stopped_heartbeats_are_dropped_without_beating() -> None:
    """Heartbeats stopped before they are due are dropped from the scheduler's heap
    without being run (no wake-up of its thread for each)."""
    beats: list[str] = []
    stopped = [_Counted(0.05, lambda: beats.append("stopped") is None) for _ in range(200)]
    for hb in stopped:
        hb.start()
        hb.stop()
    live = Heartbeat(0.05, lambda: beats.append("live") is None)
    live.start()
    try:
        deadline = time.monotonic() + 5
        while beats.count("live") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        live.stop()
    assert set(beats) == {"live"}
    assert _Counted.ran == []  # none of them was run, even to find it stopped
    assert not set(_Renewals.get().pending()) & set(stopped)
