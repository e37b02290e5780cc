# SPDX-License-Identifier: MIT
"""Redis Streams publisher and consumer against a real Redis (one key prefix per test)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
from hypothesis import given
from hypothesis import strategies as st
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

import onceonly
from onceonly.brokers.redis_streams import (
    RedisStreamsConsumer,
    RedisStreamsPublisher,
    StreamEntry,
)
from onceonly.brokers.redis_streams._wire import message_id as _message_id
from onceonly.errors import PublishError
from onceonly.messaging import OutboxMessage
from tests.conftest import unavailable

pytestmark = pytest.mark.timeout(30)

REDIS_URL = os.environ.get("ONCEONLY_TEST_REDIS", "redis://127.0.0.1:6379/0")


@pytest.fixture
async def r() -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(REDIS_URL)
    try:
        await asyncio.wait_for(client.ping(), 3)
    except (OSError, asyncio.TimeoutError, redis.RedisError):
        await client.aclose()
        unavailable(f"Redis at {REDIS_URL}")
    yield client
    await client.aclose()


@pytest.fixture
async def prefix(r: redis.asyncio.Redis) -> AsyncIterator[str]:
    """A key prefix of this test's own; every key under it is deleted at the end."""
    p = f"onceonly-test:{uuid.uuid4().hex[:12]}:"
    yield p
    keys = [k async for k in r.scan_iter(match=f"{p}*")]
    if keys:
        await r.delete(*keys)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Any]:
    s = onceonly.open_async_store(f"sqlite:///{tmp_path}/x.db")
    await s.migrate()
    async with s.transaction() as tx:
        await tx.execute("CREATE TABLE ledger (id TEXT NOT NULL)")
    yield s
    await s.close()


async def ledger(store: Any) -> list[str]:
    async with store.transaction() as tx:
        cur = await tx.execute("SELECT id FROM ledger ORDER BY id")
        return [row[0] for row in await cur.fetchall()]


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 8.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def pending(r: redis.asyncio.Redis, stream: str, group: str = "g") -> int:
    return int((await r.xpending(stream, group))["pending"])


async def drained(r: redis.asyncio.Redis, stream: str, group: str = "g") -> bool:
    """Every entry of the stream was delivered to the group and acknowledged."""
    last = await r.xrevrange(stream, count=1)
    info = {(g["name"]): g for g in await r.xinfo_groups(stream)}.get(group.encode())
    return bool(info and last and info["last-delivered-id"] == last[0][0] and info["pending"] == 0)


def message(mid: str, payload: Any, topic: str = "in", **kw: Any) -> OutboxMessage:
    return OutboxMessage(id=mid, topic=topic, payload=json.dumps(payload), **kw)


def consumer(
    r: redis.asyncio.Redis, inbox: onceonly.AsyncInbox, handler: Any, stream: str, **kw: Any
) -> RedisStreamsConsumer:
    kw.setdefault("group", "g")
    kw.setdefault("consumer_name", "c1")
    kw.setdefault("block_ms", 50)
    kw.setdefault("retry_delay", 0.05)
    return RedisStreamsConsumer(inbox, handler, connection=r, stream=stream, **kw)


async def test_publish_confirms_and_message_id_arrives(
    r: redis.asyncio.Redis, prefix: str, store: Any
) -> None:
    """XADD carries id/payload/headers/key; the consumer sees message.id as the broker id."""
    async with RedisStreamsPublisher(connection=r, stream_prefix=prefix) as pub:
        msg = message("m-1", {"n": 1}, key="k-1", headers={"x-trace": "t1"})
        await pub.publish(msg)
    stream = f"{prefix}in"
    [(entry_id, fields)] = await r.xrange(stream)
    assert fields[b"id"] == b"m-1"
    assert json.loads(fields[b"payload"]) == {"n": 1}
    assert fields[b"key"] == b"k-1"
    headers = json.loads(fields[b"headers"])
    assert headers == {"content-type": "application/json", "x-trace": "t1", "onceonly-key": "k-1"}

    seen: list[Any] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        seen.append((payload, tx.key, tx.delivery))

    inbox = onceonly.AsyncInbox(store, consumer="svc")
    async with consumer(r, inbox, handler, stream):
        await eventually(lambda: drained(r, stream))
    [(payload, key, delivery)] = seen
    assert (payload, key, delivery.message_id, delivery.source) == ({"n": 1}, "m-1", "m-1", stream)
    assert (delivery.delivery_count, delivery.redelivered) == (1, False)
    assert delivery.headers["x-trace"] == "t1"
    assert isinstance(delivery.raw, StreamEntry)
    assert delivery.raw.entry_id == entry_id.decode()


async def test_publish_to_a_key_that_is_not_a_stream_raises(
    r: redis.asyncio.Redis, prefix: str
) -> None:
    """WRONGTYPE (the topic's key holds a string) is a PublishError chained to Redis's error."""
    await r.set(f"{prefix}taken", "not a stream")
    async with RedisStreamsPublisher(connection=r, stream_prefix=prefix) as pub:
        with pytest.raises(PublishError) as info:
            await pub.publish(message("m-1", {}, topic="taken"))
    assert isinstance(info.value.__cause__, ResponseError)
    assert "WRONGTYPE" in str(info.value.__cause__)
    assert info.value.key == "m-1"


async def test_publish_connection_failure_raises_then_reconnects(
    r: redis.asyncio.Redis, prefix: str
) -> None:
    """An unreachable Redis is a PublishError; after a killed connection, publishing resumes."""
    dead = RedisStreamsPublisher("redis://127.0.0.1:1/0", timeout=3)
    with pytest.raises(PublishError) as info:
        await dead.publish(message("m-0", {}))
    assert isinstance(info.value.__cause__, (RedisConnectionError, OSError))
    await dead.close()

    name = f"pub-{uuid.uuid4().hex[:8]}"
    pub = RedisStreamsPublisher(REDIS_URL, stream_prefix=prefix, client_name=name)
    await pub.publish(message("m-1", {}))
    killed = [c["id"] for c in await r.client_list() if c.get("name") == name]
    assert killed
    for client_id in killed:
        await r.client_kill_filter(_id=client_id)
    try:  # the publish that meets the dead connection may fail (a PublishError) ...
        await pub.publish(message("m-2", {}))
    except PublishError as exc:
        assert isinstance(exc.__cause__, RedisConnectionError)
    await pub.publish(message("m-3", {}))  # ... the next one reconnects
    await pub.close()
    ids = [f[b"id"] for _, f in await r.xrange(f"{prefix}in")]
    assert ids[0] == b"m-1"
    assert ids[-1] == b"m-3"
    with pytest.raises(PublishError):
        await pub.publish(message("m-4", {}))


async def test_each_message_once_and_ack_only_after_commit(
    r: redis.asyncio.Redis, prefix: str, store: Any
) -> None:
    """Three ids plus a duplicate: three business rows, the duplicate acked without a run."""
    stream = f"{prefix}in"
    async with RedisStreamsPublisher(connection=r, stream_prefix=prefix) as pub:
        for mid in ("m-1", "m-2", "m-3", "m-1"):
            await pub.publish(message(mid, {"id": mid}))
    calls: list[str] = []
    acked_early: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        calls.append(tx.key)
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (payload["id"],))
        entry = tx.delivery.raw.entry_id
        if not await r.xpending_range(stream, "g", entry, entry, 1):
            acked_early.append(tx.key)  # acked before the commit: must never happen

    inbox = onceonly.AsyncInbox(store, consumer="svc")
    async with consumer(r, inbox, handler, stream, concurrency=1):
        await eventually(lambda: drained(r, stream))
    assert sorted(calls) == ["m-1", "m-2", "m-3"]
    assert await ledger(store) == ["m-1", "m-2", "m-3"]
    assert acked_early == []
    assert await pending(r, stream) == 0


async def test_poison_message_is_dead_lettered_with_headers_and_acked(
    r: redis.asyncio.Redis, prefix: str, store: Any
) -> None:
    """max_attempts=2 and a handler that always raises: one dead-letter entry, then acked."""
    stream, dead = f"{prefix}in", f"{prefix}in.dead"
    async with RedisStreamsPublisher(connection=r, stream_prefix=prefix) as pub:
        await pub.publish(message("m-poison", {"bad": True}, headers={"x-trace": "t"}))
    calls: list[int] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        calls.append(tx.attempt)
        raise ValueError("boom")

    inbox = onceonly.AsyncInbox(store, consumer="svc", max_attempts=2)
    async with consumer(r, inbox, handler, stream):
        await eventually(lambda: drained(r, stream))
        await asyncio.sleep(0.3)  # nothing comes back
    assert calls == [1, 2]
    [(_, fields)] = await r.xrange(dead)
    assert fields[b"id"] == b"m-poison"
    assert json.loads(fields[b"payload"]) == {"bad": True}
    headers = json.loads(fields[b"headers"])
    assert headers["onceonly-dead-reason"] == "dead-lettered"
    assert "boom" in headers["onceonly-error"]
    assert headers["onceonly-attempts"] == "2"
    assert headers["onceonly-message-id"] == "m-poison"
    assert headers["x-trace"] == "t"
    assert await pending(r, stream) == 0


async def test_entry_without_payload_field_is_read_as_its_fields(
    r: redis.asyncio.Redis, prefix: str, store: Any
) -> None:
    """An entry written by a plain XADD (id, amount) reaches the handler as {'amount': '5'}."""
    stream = f"{prefix}in"
    await r.xadd(stream, {"id": "m-1", "amount": "5"})
    seen: list[Any] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        seen.append((tx.key, payload))

    async with consumer(r, onceonly.AsyncInbox(store, consumer="svc"), handler, stream):
        await eventually(lambda: drained(r, stream))
    assert seen == [("m-1", {"amount": "5"})]


async def test_failed_dead_letter_publish_leaves_the_entry_pending(
    r: redis.asyncio.Redis, prefix: str, store: Any
) -> None:
    """While the dead-letter XADD fails the entry stays pending; once it works, it is acked."""
    stream, dead = f"{prefix}in", f"{prefix}in.dead"
    await r.set(dead, "blocks the dead-letter stream")
    await r.xadd(stream, {"payload": "{}"})

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        raise AssertionError("never runs")

    inbox = onceonly.AsyncInbox(store, consumer="svc")
    async with consumer(r, inbox, handler, stream):
        await eventually(lambda: _delivered(r, stream))
        await asyncio.sleep(0.3)
        assert await pending(r, stream) == 1  # not acked: never a silent drop
        await r.delete(dead)
        await eventually(lambda: drained(r, stream))
    assert await r.xlen(dead) == 1


async def _delivered(r: redis.asyncio.Redis, stream: str) -> bool:
    groups = await r.xinfo_groups(stream)
    return bool(groups) and groups[0]["last-delivered-id"] != b"0-0"


async def test_heartbeat_keeps_a_long_handler_from_being_taken_over(
    r: redis.asyncio.Redis, prefix: str, store: Any
) -> None:
    """claim_idle=1s, a 3s handler on A: B's XAUTOCLAIM never takes it; one delivery in all."""
    stream = f"{prefix}in"
    started = asyncio.Event()
    by: list[str] = []

    def handler_for(name: str) -> Any:
        async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
            by.append(name)
            started.set()
            if name == "a":
                await asyncio.sleep(3)

        return handler

    inbox = onceonly.AsyncInbox(store, consumer="svc")
    a = consumer(r, inbox, handler_for("a"), stream, consumer_name="a", claim_idle=1)
    b = consumer(r, inbox, handler_for("b"), stream, consumer_name="b", claim_idle=1)
    async with a:
        async with RedisStreamsPublisher(connection=r, stream_prefix=prefix) as pub:
            await pub.publish(message("m-long", {}))
        await asyncio.wait_for(started.wait(), 5)
        owners: set[tuple[bytes, int]] = set()
        async with b:
            while by == ["a"] and await pending(r, stream):
                # the handler may finish between the two reads: nothing pending then
                for p in await r.xpending_range(stream, "g", "-", "+", 1):
                    owners.add((p["consumer"], p["times_delivered"]))
                await asyncio.sleep(0.1)
            await eventually(lambda: drained(r, stream))
    assert by == ["a"]
    assert owners == {(b"a", 1)}


async def test_entry_of_a_dead_consumer_is_taken_over_after_claim_idle(
    r: redis.asyncio.Redis, prefix: str, store: Any
) -> None:
    """An entry read but never acked by a vanished consumer is processed once after claim_idle."""
    stream = f"{prefix}in"
    await r.xgroup_create(stream, "g", id="0", mkstream=True)
    async with RedisStreamsPublisher(connection=r, stream_prefix=prefix) as pub:
        await pub.publish(message("m-orphan", {"id": "m-orphan"}))
    assert await r.xreadgroup("g", "ghost", {stream: ">"}, count=1)  # and then it died
    read_at = time.monotonic()
    seen: list[tuple[float, int | None, bool]] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        assert tx.delivery is not None
        seen.append(
            (time.monotonic() - read_at, tx.delivery.delivery_count, tx.delivery.redelivered)
        )
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (payload["id"],))

    inbox = onceonly.AsyncInbox(store, consumer="svc")
    async with consumer(r, inbox, handler, stream, consumer_name="b", claim_idle=1):
        await eventually(lambda: drained(r, stream), timeout=5)
        await asyncio.sleep(0.6)  # another XAUTOCLAIM round: nothing more
    [(after, count, redelivered)] = seen
    assert after >= 0.95
    assert (count, redelivered) == (2, True)
    assert await ledger(store) == ["m-orphan"]


async def test_graceful_stop_finishes_and_acks_the_in_flight_handler(
    r: redis.asyncio.Redis, prefix: str, store: Any
) -> None:
    """stop() during a 1s handler waits for it, commits, acks, and leaves the group."""
    stream = f"{prefix}in"
    async with RedisStreamsPublisher(connection=r, stream_prefix=prefix) as pub:
        await pub.publish(message("m-1", {"id": "m-1"}))
    started = asyncio.Event()

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        started.set()
        await asyncio.sleep(1)
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (payload["id"],))

    c = consumer(r, onceonly.AsyncInbox(store, consumer="svc"), handler, stream)
    task = asyncio.create_task(c.run())
    await asyncio.wait_for(started.wait(), 5)
    await c.stop()
    assert task.done()
    assert await ledger(store) == ["m-1"]
    assert await pending(r, stream) == 0
    assert await r.xinfo_consumers(stream, "g") == []


async def test_stop_past_shutdown_timeout_rolls_back_and_leaves_the_entry_pending(
    r: redis.asyncio.Redis, prefix: str, store: Any
) -> None:
    """A handler still running at shutdown_timeout is cancelled: no row, entry still pending."""
    stream = f"{prefix}in"
    async with RedisStreamsPublisher(connection=r, stream_prefix=prefix) as pub:
        await pub.publish(message("m-1", {"id": "m-1"}))
    started = asyncio.Event()

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (payload["id"],))
        started.set()
        await asyncio.sleep(30)

    inbox = onceonly.AsyncInbox(store, consumer="svc")
    c = consumer(r, inbox, handler, stream, shutdown_timeout=0.2)
    task = asyncio.create_task(c.run())
    await asyncio.wait_for(started.wait(), 5)
    await c.stop()
    assert task.done()
    assert await ledger(store) == []
    assert await pending(r, stream) == 1
    assert [x["name"] for x in await r.xinfo_consumers(stream, "g")] == [b"c1"]


async def test_many_messages_with_concurrent_handlers_each_run_once(
    r: redis.asyncio.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """60 entries (20 ids, three times each) on 16 handlers: 20 runs; shared XACKs ack all."""
    stream = f"{prefix}in"
    async with RedisStreamsPublisher(connection=r, stream_prefix=prefix) as pub:
        for i in range(60):
            await pub.publish(message(f"m-{i % 20:02d}", {"id": f"m-{i % 20:02d}"}))
    calls: list[str] = []
    xacks: list[int] = []
    xack = r.xack

    async def spy(name: str, group: str, *ids: Any) -> Any:
        xacks.append(len(ids))
        return await xack(name, group, *ids)

    monkeypatch.setattr(r, "xack", spy)

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        calls.append(tx.key)
        await asyncio.sleep(0.01)  # the memory store lets distinct keys run side by side

    store = onceonly.open_async_store("memory://")
    inbox = onceonly.AsyncInbox(store, consumer="svc")
    async with consumer(r, inbox, handler, stream, concurrency=16, count=8):
        await eventually(lambda: drained(r, stream))
    await store.close()
    assert sorted(calls) == [f"m-{i:02d}" for i in range(20)]
    assert sum(xacks) == 60
    assert max(xacks) > 1


async def test_cancelled_run_rolls_back_and_leaves_the_entry_pending(
    r: redis.asyncio.Redis, prefix: str, store: Any
) -> None:
    """Cancelling run() cancels the running handler at once: no row, no ack."""
    stream = f"{prefix}in"
    async with RedisStreamsPublisher(connection=r, stream_prefix=prefix) as pub:
        await pub.publish(message("m-1", {"id": "m-1"}))
    started = asyncio.Event()

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (payload["id"],))
        started.set()
        await asyncio.sleep(30)

    c = consumer(r, onceonly.AsyncInbox(store, consumer="svc"), handler, stream)
    task = asyncio.create_task(c.run())
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await ledger(store) == []
    assert await pending(r, stream) == 1


# -- settlement: every delivery ends acked, retried with backoff, or dead-lettered ---------


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


async def dead_letters(r: redis.asyncio.Redis, stream: str) -> list[tuple[dict[bytes, Any], Any]]:
    """The dead-letter entries: (fields, decoded headers)."""
    return [(f, json.loads(f[b"headers"])) for _, f in await r.xrange(f"{stream}.dead")]


@pytest.mark.parametrize(
    "transient",
    [
        lambda: onceonly.StoreUnavailable("connection lost"),
        lambda: onceonly.InFlight("held elsewhere", retry_after=0.01),
    ],
    ids=["store-unavailable", "in-flight"],
)
async def test_transient_errors_are_retried_without_counting(
    r: redis.asyncio.Redis, prefix: str, store: Any, transient: Callable[[], Exception]
) -> None:
    """Four StoreUnavailable/InFlight: retried with backoff, no redelivery, no attempt used."""
    stream = f"{prefix}in"
    await r.xadd(stream, {"id": "m-1", "payload": "{}"})
    seen: list[tuple[int | None, int]] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        seen.append((tx.delivery.delivery_count if tx.delivery else None, tx.attempt))
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (tx.key,))

    inbox = onceonly.AsyncInbox(store, consumer="svc")
    real = inbox.process
    failures = [transient() for _ in range(4)]

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return await real(*args, **kwargs)

    inbox.process = flaky  # type: ignore[method-assign]
    async with consumer(r, inbox, handler, stream, max_deliveries=2):
        await eventually(lambda: drained(r, stream))
    assert seen == [(1, 1)]  # delivered once: Redis's count never moved
    assert await ledger(store) == ["m-1"]
    assert not await r.exists(f"{stream}.dead")


@pytest.mark.parametrize("case", ["too-large", "unencodable"])
async def test_result_too_large_or_unencodable_is_dead_lettered(
    r: redis.asyncio.Redis, prefix: str, store: Any, case: str
) -> None:
    """TooLarge / EncodingError from the inbox: dead-lettered after one run, not retried."""
    stream = f"{prefix}in"
    await r.xadd(stream, {"id": "m-1", "payload": "{}"})
    calls: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> Any:
        calls.append(tx.key)
        return "x" * 100 if case == "too-large" else object()

    inbox = onceonly.AsyncInbox(store, consumer="svc", max_result_bytes=16)
    async with consumer(r, inbox, handler, stream):
        await eventually(lambda: drained(r, stream))
    [(_, headers)] = await dead_letters(r, stream)
    assert headers["onceonly-dead-reason"] == case
    assert calls == ["m-1"]


async def test_worker_killed_by_its_handler_is_dead_lettered_after_max_deliveries(
    r: redis.asyncio.Redis, prefix: str, store: Any, tmp_path: Path
) -> None:
    """A handler that kills the worker (nothing commits): dead-lettered unrun on delivery 4."""
    from tests.brokers._crash_consumer import EXIT_IN_HANDLER, crash_loop, runs

    stream = f"{prefix}in"
    await r.xadd(stream, {"id": "m-poison", "payload": "{}"})
    config = {
        "broker": "redis",
        "url": REDIS_URL,
        "stream": stream,
        "db": str(tmp_path / "x.db"),
        "runs": str(tmp_path / "runs"),
        "max_deliveries": 3,
    }

    async def count() -> int:
        return len(await dead_letters(r, stream))

    exits = await crash_loop(config, count)
    assert exits == [EXIT_IN_HANDLER] * 3
    assert runs(tmp_path / "runs") == [1, 2, 3]
    [(fields, headers)] = await dead_letters(r, stream)
    assert headers["onceonly-dead-reason"] == "max-deliveries"
    assert fields[b"id"] == b"m-poison"
    assert await ledger(store) == []
    assert await pending(r, stream) == 0


async def test_non_utf8_message_ids_stay_distinct(
    r: redis.asyncio.Redis, prefix: str, store: Any
) -> None:
    """Ids b'\\xff', b'\\xfe', and the text of b'\\xff''s b64: form are three messages."""
    stream = f"{prefix}in"
    ids = [b"\xff", b"\xfe", b"b64:/w==", b"plain"]
    for n, raw in enumerate(ids):
        await r.xadd(stream, {"id": raw, "payload": json.dumps({"n": n})})
    keys: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        keys.append(tx.key)

    inbox = onceonly.AsyncInbox(store, consumer="svc")
    async with consumer(r, inbox, handler, stream, concurrency=1):
        await eventually(lambda: drained(r, stream))
    assert keys == ["b64:/w==", "b64:/g==", "b64:YjY0Oi93PT0=", "plain"]
    assert not await r.exists(f"{stream}.dead")


async def test_dead_letter_keeps_a_non_utf8_id_as_it_came(
    r: redis.asyncio.Redis, prefix: str, store: Any
) -> None:
    """A dead letter carries the entry's own id bytes (its b64: key in the header)."""
    stream = f"{prefix}in"
    await r.xadd(stream, {"id": b"\xff\x00", "payload": nested(10_000)})

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        raise AssertionError("never runs")

    async with consumer(r, onceonly.AsyncInbox(store, consumer="svc"), handler, stream):
        await eventually(lambda: drained(r, stream))
    [(fields, headers)] = await dead_letters(r, stream)
    assert fields[b"id"] == b"\xff\x00"
    assert headers["onceonly-dead-reason"] == "undecodable"


def original_id(message_id: str) -> bytes:
    """The id bytes a message id was made from (the inverse of _message_id)."""
    if message_id.startswith("b64:"):
        return base64.b64decode(message_id[4:], validate=True)
    return message_id.encode("utf-8")


@given(st.binary(max_size=40), st.binary(max_size=40))
def test_message_id_decoding_is_injective(a: bytes, b: bytes) -> None:
    """Distinct id bytes give distinct message ids, and each maps back to its bytes."""
    assert original_id(_message_id(a)) == a
    if a != b:
        assert _message_id(a) != _message_id(b)


@given(st.text(max_size=40).filter(lambda t: not t.startswith("b64:")))
def test_message_id_keeps_valid_utf8_text(text: str) -> None:
    """A valid UTF-8 id not starting with b64: is its own message id (as bytes or str)."""
    assert _message_id(text.encode("utf-8")) == text
    assert _message_id(text) == text


@pytest.mark.parametrize("policy", ["warn", "refuse", "off"])
async def test_dedup_window_is_checked_at_start(
    r: redis.asyncio.Redis, prefix: str, store: Any, policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An inbox ttl (10 s) shorter than max_deliveries x claim_idle (3 x 30 s): warned,
    refused, or let be, at start."""
    inbox = onceonly.AsyncInbox(store, consumer="c", ttl=10)
    c = consumer(
        r, inbox, lambda p, tx: None, f"{prefix}in", claim_idle=30, max_deliveries=3,
        dedup_window=policy,
    )  # fmt: skip
    caplog.set_level("WARNING", logger="onceonly.brokers.redis_streams")
    if policy == "refuse":
        with pytest.raises(onceonly.ConfigurationError, match="max_deliveries x claim_idle: 90 s"):
            await asyncio.wait_for(c.run(), 10)
        return
    task = asyncio.ensure_future(c.run())
    await asyncio.sleep(0.3)
    await c.stop()
    await asyncio.wait_for(task, 10)
    warned = [r for r in caplog.records if "redelivery horizon" in r.getMessage()]
    assert len(warned) == (1 if policy == "warn" else 0)


async def test_consumers_killed_long_ago_are_removed_from_the_group(
    r: redis.asyncio.Redis, prefix: str, store: Any
) -> None:
    """Two members a SIGKILL left behind (default names, one with an entry still pending):
    the idle one with nothing pending is deleted at start; the other once its entry was
    taken over and processed. The running member stays."""
    stream = f"{prefix}in"
    await r.xgroup_create(stream, "g", id="0", mkstream=True)
    await r.xadd(stream, {"id": "m-1", "payload": "{}"})
    await r.xadd(stream, {"id": "m-2", "payload": "{}"})
    [[_, [(done_id, _)]]] = await r.xreadgroup("g", "host-101", {stream: ">"}, count=1)
    await r.xack(stream, "g", done_id)  # host-101 finished its work, then was killed
    await r.xreadgroup("g", "host-102", {stream: ">"}, count=1)  # killed holding m-2
    await asyncio.sleep(1.1)
    calls: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        calls.append(tx.key)

    async def members() -> set[str]:
        return {c["name"].decode() for c in await r.xinfo_consumers(stream, "g")}

    inbox = onceonly.AsyncInbox(store, consumer="svc")
    c = consumer(r, inbox, handler, stream, claim_idle=0.5, forget_idle=1.0)
    async with c:
        await eventually(lambda: _is(members(), lambda m: "host-101" not in m))
        await eventually(lambda: _is(members(), lambda m: m == {"c1"}), timeout=10)
    assert calls == ["m-2"]
    assert await pending(r, stream) == 0


async def _is(value: Awaitable[Any], check: Callable[[Any], bool]) -> bool:
    return check(await value)
