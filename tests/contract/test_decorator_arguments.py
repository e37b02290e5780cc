# SPDX-License-Identifier: MIT
"""``@idempotent`` fingerprints a call by its bound arguments, however they were passed.

Calls passing every parameter positionally are bound without ``Signature.bind`` (a fast
path); the fingerprint and the payload snapshot must be the same as when they are bound.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import onceonly
from onceonly._acompat import Heartbeat


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
