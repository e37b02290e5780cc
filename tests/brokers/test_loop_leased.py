# SPDX-License-Identifier: MIT
"""The consumer loop on a leased inbox (docs/spec.md §1.4a, §4.6), on the in-memory
broker: deliveries run alone, failures count to a dead letter, batches are refused."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import onceonly
from onceonly.testing import MemoryBroker, MemoryConsumer

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
async def inbox() -> AsyncIterator[onceonly.AsyncInbox]:
    store = onceonly.open_async_store("memory://")
    yield onceonly.AsyncInbox(store, consumer="loop", mode="leased", max_attempts=2)
    await store.close()


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def test_a_leased_inbox_consumes_once_and_dead_letters(inbox: onceonly.AsyncInbox) -> None:
    """Duplicates replay (acked, run once); a failing message is dead after max_attempts."""
    broker = MemoryBroker()
    runs: list[tuple[str, int]] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> int:
        assert tx.delivery is not None and tx.delivery.source == "q"
        runs.append((tx.key, tx.attempt))
        if payload["fail"]:
            raise ValueError("provider refused")
        return 1

    for mid, fail in (("m-1", False), ("m-1", False), ("bad", True)):
        broker.send("q", {"fail": fail}, message_id=mid)
    consumer = MemoryConsumer(
        inbox, handler, broker=broker, queue="q", retry_delay=0.01, max_backoff=0.05
    )
    async with consumer:
        await eventually(lambda: bool(broker.dead_letters.get("q.dead")))
    assert sorted(runs) == [("bad", 1), ("bad", 2), ("m-1", 1)]
    assert len(broker.acked["q"]) == 3  # two of m-1, and the dead letter


def test_batches_need_atomic_mode(inbox: onceonly.AsyncInbox) -> None:
    """batch_size > 1 with a leased inbox is a ConfigurationError."""

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        return None

    with pytest.raises(onceonly.ConfigurationError, match="atomic mode"):
        MemoryConsumer(inbox, handler, broker=MemoryBroker(), queue="q", batch_size=5)
