# SPDX-License-Identifier: MIT
"""Round trips of the Redis Streams consumer per message, counted on the wire (a proxy
that parses the commands): a regression fails here even though timings never gate CI."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError

import onceonly
from tests.brokers._redis_wire import CountingProxy
from tests.brokers.test_redis_streams import consumer, drained, eventually, pending, r, wire

__all__ = ["r", "wire"]  # fixtures

pytestmark = pytest.mark.timeout(30)

N = 30


@pytest.fixture
async def stream(r: redis.asyncio.Redis) -> AsyncIterator[str]:
    """A stream of ``N`` entries (written directly, not through the proxy)."""
    name = f"onceonly-test:rt:{id(r):x}:{asyncio.get_running_loop().time():.6f}"
    for i in range(N):
        await r.xadd(name, {"id": f"m{i}", "payload": json.dumps({"n": i}), "headers": "{}"})
    yield name
    await r.delete(name, f"{name}.dead")


async def test_one_round_trip_per_message_at_concurrency_1(
    r: redis.asyncio.Redis, wire: tuple[CountingProxy, redis.asyncio.Redis], stream: str
) -> None:
    """Each ack rides ahead of the next read: XACK then XREADGROUP in one round trip per
    message (it was two), in that order, so no more entries are held than slots."""
    proxy, through = wire
    inbox = onceonly.AsyncInbox(onceonly.open_async_store("memory://"), consumer="svc")
    ran: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        ran.append(tx.key)

    async with consumer(through, inbox, handler, stream, concurrency=1, count=1, block_ms=500):
        await eventually(lambda: drained(r, stream))
    assert sorted(ran) == sorted(f"m{i}" for i in range(N))
    reads = [trip for trip in proxy.trips if {"XREADGROUP", "XACK"} & set(trip)]
    # the first read alone; then each message's ack ahead of the next read (the last
    # one's read waits for an entry until the stop)
    assert Counter(map(tuple, reads)) == {("XREADGROUP",): 1, ("XACK", "XREADGROUP"): N}
    assert proxy.commands["XACK"] == N
    startup = {"HELLO", "CLIENT", "XGROUP", "EVALSHA", "XAUTOCLAIM"}
    assert set(proxy.commands) <= startup | {"XREADGROUP", "XACK"}


async def test_an_ack_that_fails_is_fetched_again_replayed_and_acked(
    r: redis.asyncio.Redis,
    wire: tuple[CountingProxy, redis.asyncio.Redis],
    stream: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The round trip carrying an ack fails, and so does the XACK sent alone: the entry
    stays pending, is fetched again (delivery 2), replayed by the inbox without running,
    and acked."""
    _, through = wire
    store = onceonly.open_async_store("memory://")
    inbox = onceonly.AsyncInbox(store, consumer="svc")
    ran: Counter[str] = Counter()
    counts: dict[str, list[int | None]] = {}

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        ran[tx.key] += 1

    real_pipeline, real_xack = through.pipeline, through.xack
    failures = {"pipeline": 1, "xack": 1}

    def pipeline(*a: Any, **kw: Any) -> Any:
        pipe = real_pipeline(*a, **kw)
        if failures["pipeline"]:
            failures["pipeline"] -= 1

            async def execute(*a: Any, **kw: Any) -> Any:
                raise RedisConnectionError("connection lost (test)")

            pipe.execute = execute  # type: ignore[method-assign]
        return pipe

    async def xack(*a: Any) -> Any:
        if failures["xack"]:
            failures["xack"] -= 1
            raise RedisConnectionError("connection lost (test)")
        return await real_xack(*a)

    monkeypatch.setattr(through, "pipeline", pipeline)
    monkeypatch.setattr(through, "xack", xack)
    original = inbox.process

    async def process(key: str, payload: Any, h: Any, **kw: Any) -> Any:
        counts.setdefault(key, []).append(kw["delivery"].delivery_count)
        return await original(key, payload, h, **kw)

    monkeypatch.setattr(inbox, "process", process)
    async with consumer(through, inbox, handler, stream, concurrency=1, count=1):
        await eventually(lambda: drained(r, stream))
        assert await pending(r, stream) == 0
    await store.close()
    assert failures == {"pipeline": 0, "xack": 0}
    assert ran == {f"m{i}": 1 for i in range(N)}  # every entry ran exactly once
    again = [k for k, c in counts.items() if len(c) > 1]
    assert len(again) == 1 and counts[again[0]] == [1, 2]  # fetched again: delivery 2
