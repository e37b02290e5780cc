# SPDX-License-Identifier: MIT
"""``wait=0`` means "answer InFlight at once", on every store and surface (spec §2.4)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import onceonly
from onceonly.errors import ConfigurationError, InFlight

# Under load a store's own round trips take a while; "at once" is well under the lease
# and the default wait (5 s), and on MySQL within its one-second lock-wait granularity.
AT_ONCE = 1.5


def _holding(start: Any) -> tuple[threading.Thread, threading.Event, threading.Event]:
    """Run ``start(entered, release)`` in a thread; returns it and its two events."""
    entered, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=start, args=(entered, release))
    thread.start()
    assert entered.wait(10), "the first call never started"
    return thread, entered, release


def test_idempotent_wait_zero_answers_in_flight_at_once(leased_store: Any) -> None:
    """@idempotent(wait=0): a duplicate of a running call raises InFlight at once."""
    gate: dict[str, threading.Event] = {}

    @onceonly.idempotent(leased_store, key=lambda k: k, wait=0, lease=30, scope="slow")
    def slow(k: str) -> str:
        gate["entered"].set()
        gate["release"].wait(10)
        return "done"

    def first(entered: threading.Event, release: threading.Event) -> None:
        gate.update(entered=entered, release=release)
        slow("k")

    thread, _, release = _holding(first)
    try:
        began = time.monotonic()
        with pytest.raises(InFlight):
            slow("k")
        assert time.monotonic() - began < AT_ONCE
    finally:
        release.set()
        thread.join(10)
    assert slow("k") == "done"  # replayed


@pytest.mark.parametrize("mode", ["atomic", "leased"])
def test_inbox_wait_zero_answers_in_flight_at_once(store: Any, mode: str) -> None:
    """Inbox(wait=0): a concurrent duplicate delivery gets InFlight at once."""
    if mode == "atomic" and not getattr(store, "atomic", False):
        pytest.skip("this store has no atomic mode")
    inbox = onceonly.Inbox(store, consumer="billing", wait=0, mode=mode)

    def first(entered: threading.Event, release: threading.Event) -> None:
        def handler(payload: Any, tx: Any) -> str:
            entered.set()
            release.wait(10)
            return "done"

        inbox.process("m-1", {"n": 1}, handler)

    thread, _, release = _holding(first)
    try:
        began = time.monotonic()
        with pytest.raises(InFlight):
            inbox.process("m-1", {"n": 1}, lambda payload, tx: "again")
        assert time.monotonic() - began < AT_ONCE
    finally:
        release.set()
        thread.join(10)
    again = inbox.process("m-1", {"n": 1}, lambda payload, tx: "again")
    assert (again.result, again.replayed) == ("done", True)


def test_async_idempotent_accepts_wait_zero() -> None:
    """The async decorator accepts wait=0 and answers InFlight at once."""
    store = onceonly.open_async_store("memory://")

    async def main() -> None:
        release = asyncio.Event()
        entered = asyncio.Event()

        @onceonly.idempotent(store, key=lambda k: k, wait=0, scope="slow")
        async def slow(k: str) -> str:
            entered.set()
            await release.wait()
            return "done"

        task = asyncio.ensure_future(slow("k"))
        await entered.wait()
        with pytest.raises(InFlight):
            await slow("k")
        release.set()
        assert await task == "done"
        await store.close()

    asyncio.run(main())


@pytest.mark.parametrize("wait", [-1, -0.001, float("nan")])
def test_a_negative_wait_is_still_refused(wait: float) -> None:
    """Only zero joins the positive waits: a negative or NaN wait is refused."""
    with pytest.raises(ConfigurationError, match="zero or positive"):
        onceonly.idempotent(onceonly.open_store("memory://"), key=lambda: "k", wait=wait)
