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
from onceonly.brokers.redis_streams._transport import _ACK_READ
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
    """Each ack rides with the next read: one script (XACK, then XREADGROUP without
    blocking) per message, one round trip (it was two: XREADGROUP, then XACK); a blocking
    XREADGROUP only first and once the stream is empty."""
    proxy, through = wire
    sha = (await r.script_load(_ACK_READ)).encode()  # loaded: no NOSCRIPT round trip
    inbox = onceonly.AsyncInbox(onceonly.open_async_store("memory://"), consumer="svc")
    ran: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        ran.append(tx.key)

    async with consumer(through, inbox, handler, stream, concurrency=1, count=1, block_ms=500):
        await eventually(lambda: drained(r, stream))
    assert sorted(ran) == sorted(f"m{i}" for i in range(N))
    reads = [
        trip
        for trip, sent in zip(proxy.trips, _commands_by_trip(proxy), strict=True)
        if {"XREADGROUP", "XACK"} & set(trip) or any(a[1] == sha for a in sent)
    ]
    # the first read; each message's ack with the next read (for the last one, that
    # finds nothing: then the blocking read waits for an entry until the stop)
    assert Counter(map(tuple, reads)) == {("XREADGROUP",): 2, ("EVALSHA",): N}
    acked = [a[7:] for a in proxy.sent if a[0] == b"EVALSHA" and a[1] == sha]
    assert [len(ids) for ids in acked] == [1] * N  # one id each, every id once
    assert len({i for ids in acked for i in ids}) == N
    assert proxy.commands["XACK"] == 0
    startup = {"HELLO", "CLIENT", "XGROUP", "EVALSHA", "XAUTOCLAIM"}
    assert set(proxy.commands) <= startup | {"XREADGROUP"}


def _commands_by_trip(proxy: CountingProxy) -> list[list[list[bytes]]]:
    """``proxy.sent`` cut into the round trips of ``proxy.trips``, in order (one
    connection at a time is enough here: concurrency 1)."""
    out, at = [], 0
    for trip in proxy.trips:
        out.append(proxy.sent[at : at + len(trip)])
        at += len(trip)
    return out


async def test_an_ack_that_fails_is_fetched_again_replayed_and_acked(
    r: redis.asyncio.Redis,
    wire: tuple[CountingProxy, redis.asyncio.Redis],
    stream: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The read carrying an ack fails, and so does the XACK sent alone: the entry
    stays pending, is fetched again (delivery 2), replayed by the inbox without running,
    and acked."""
    _, through = wire
    store = onceonly.open_async_store("memory://")
    inbox = onceonly.AsyncInbox(store, consumer="svc")
    ran: Counter[str] = Counter()
    counts: dict[str, list[int | None]] = {}

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        ran[tx.key] += 1

    real_evalsha, real_xack = through.evalsha, through.xack
    sha = await r.script_load(_ACK_READ)
    failures = {"script": 1, "xack": 1}

    async def evalsha(script: str, numkeys: int, *args: Any) -> Any:
        if script == sha and failures["script"]:
            failures["script"] -= 1
            raise RedisConnectionError("connection lost (test)")
        return await real_evalsha(script, numkeys, *args)

    async def xack(*a: Any) -> Any:
        if failures["xack"]:
            failures["xack"] -= 1
            raise RedisConnectionError("connection lost (test)")
        return await real_xack(*a)

    monkeypatch.setattr(through, "evalsha", evalsha)
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
    assert failures == {"script": 0, "xack": 0}
    assert ran == {f"m{i}": 1 for i in range(N)}  # every entry ran exactly once
    again = [k for k, c in counts.items() if len(c) > 1]
    assert len(again) == 1 and counts[again[0]] == [1, 2]  # fetched again: delivery 2
