# SPDX-License-Identifier: MIT
"""Every consumer takes a leased inbox (docs/spec.md §1.4a, §4.6): on the Redis store,
over the in-memory broker, RabbitMQ, NATS JetStream, Redis Streams and SQS as
moto_server (a real HTTP process: no SQS runs here; tests/brokers/_kits.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import onceonly
from tests.brokers._kits import KITS, Kit
from tests.conftest import REDIS_URL, drop_redis_prefix, require_redis, unique_table

pytestmark = pytest.mark.timeout(40)


@pytest.fixture(params=sorted(KITS))
async def kit(request: pytest.FixtureRequest) -> AsyncIterator[Kit]:
    k = KITS[request.param]()
    await k.start()
    try:
        yield k
    finally:
        await k.cleanup()


@pytest.fixture
async def redis_store() -> AsyncIterator[Any]:
    require_redis()
    prefix = f"{unique_table()}:"
    store = onceonly.open_async_store(REDIS_URL, prefix=prefix)
    yield store
    await store.close()
    drop_redis_prefix(prefix)


async def test_leased_inbox_runs_once_retries_and_settles(kit: Kit, redis_store: Any) -> None:
    """Duplicates run once; a failing run is redelivered as attempt 2; all are acked."""
    inbox = onceonly.AsyncInbox(redis_store, consumer="contract")  # a 30 s lease
    assert inbox.mode == "leased"
    runs: list[tuple[str, int]] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> str:
        runs.append((tx.key, tx.attempt))
        if payload["flaky"] and tx.attempt == 1:
            raise RuntimeError("provider timed out")
        return tx.key

    await kit.send({"flaky": False}, message_id="m-1")
    await kit.send({"flaky": False}, message_id="m-1")
    await kit.send({"flaky": True}, message_id="m-2")
    async with kit.consumer(inbox, handler):
        deadline = time.monotonic() + 10
        while sorted(runs) != [("m-1", 1), ("m-2", 1), ("m-2", 2)]:
            assert time.monotonic() < deadline, runs
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
    assert sorted(runs) == [("m-1", 1), ("m-2", 1), ("m-2", 2)]
    assert await kit.settled()
    assert await kit.dead() == []
