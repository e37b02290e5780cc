# SPDX-License-Identifier: MIT
"""The broker contract: every consumer, on every broker, settles every delivery the same
way (one consumer loop, one verdict table, one dead-letter envelope).

Run over the in-memory broker (onceonly.testing), the real RabbitMQ, NATS JetStream and
Redis Streams of this machine, Kafka as Tansu 0.6.0 (a Kafka-compatible broker, not
Apache Kafka), and SQS as moto_server (a real HTTP process: no SQS runs
here), each test on a queue / stream / prefix of its own
(tests/brokers/_kits.py). Broker-specific cases stay in the per-broker files.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly._core.settle import MAX_ERROR_CHARS
from tests.brokers._kits import KITS, Kit

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


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def inbox(store: Any, **kw: Any) -> onceonly.AsyncInbox:
    return onceonly.AsyncInbox(store, consumer="contract", **kw)


async def dead_count(kit: Kit, n: int) -> bool:
    return len(await kit.dead()) >= n


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


class Declined(Exception):
    """A business error the inbox caches (cache_errors=)."""


# -- processing ----------------------------------------------------------------------


async def test_each_message_once_acked_after_commit(kit: Kit, store: Any) -> None:
    """Two deliveries of one id run the handler once; every delivery is acked."""
    calls: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        calls.append(tx.key)
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (payload["id"],))

    await kit.send({"id": "a"}, message_id="m-1")
    await kit.send({"id": "a"}, message_id="m-1")
    await kit.send({"id": "b"}, message_id="m-2")
    async with kit.consumer(inbox(store), handler):
        await eventually(lambda: _ledger_is(store, ["a", "b"]))
        await asyncio.sleep(0.2)
    assert sorted(calls) == ["m-1", "m-2"]
    assert await kit.settled()


async def _ledger_is(store: Any, rows: list[str]) -> bool:
    return await ledger(store) == rows


async def test_failed_handler_is_redelivered_with_growing_count(kit: Kit, store: Any) -> None:
    """A handler failing twice sees the message again (count 1, 2, 3, redelivered, the
    inbox's attempt), its failed runs roll back, then it commits once and is acked."""
    seen: list[tuple[int | None, bool, int]] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        assert tx.delivery is not None
        seen.append((tx.delivery.delivery_count, tx.delivery.redelivered, tx.attempt))
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (tx.key,))
        if len(seen) < 3:
            raise RuntimeError("flaky")

    await kit.send({"n": 1}, message_id="m-1")
    async with kit.consumer(inbox(store), handler):
        await eventually(lambda: _ledger_is(store, ["m-1"]))
    assert seen == [(1, False, 1), (2, True, 2), (3, True, 3)]
    assert await ledger(store) == ["m-1"]  # the failed runs rolled back
    assert await kit.settled()
    assert await kit.dead() == []


@pytest.mark.parametrize("fallback", ["content", "event_id"])
async def test_message_id_fallback(kit: Kit, store: Any, fallback: str) -> None:
    keys: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        keys.append(tx.key)

    await kit.send({"event_id": "e-1"})
    await kit.send({"event_id": "e-1"})
    async with kit.consumer(inbox(store), handler, message_id=fallback):
        await eventually(lambda: _true(len(keys) == 1))
        await asyncio.sleep(0.3)
    assert len(keys) == 1
    assert keys[0] == "e-1" if fallback == "event_id" else keys[0] != "e-1"
    assert await kit.dead() == []


async def _true(value: bool) -> bool:
    return value


async def test_cached_error_is_acked_and_not_retried(kit: Kit, store: Any) -> None:
    calls = 0

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        nonlocal calls
        calls += 1
        raise Declined("no funds")

    await kit.send({"n": 1}, message_id="m-1")
    async with kit.consumer(inbox(store, cache_errors=(Declined,)), handler):
        await eventually(lambda: _true(calls == 1))
        # after the first settled (two at once may both run in atomic mode; one commits)
        await asyncio.sleep(0.2)
        await kit.send({"n": 1}, message_id="m-1")
        await asyncio.sleep(0.5)
    assert calls == 1
    assert await kit.settled()
    assert await kit.dead() == []


# -- dead letters: one envelope ------------------------------------------------------


async def test_poison_message_is_dead_lettered_with_the_envelope(kit: Kit, store: Any) -> None:
    """A handler failing on every delivery: dead-lettered at max_deliveries, body intact,
    the same onceonly-* headers on every broker; then acked."""

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        raise ValueError("bad amount")

    await kit.send({"amount": -1}, message_id="m-1")
    async with kit.consumer(inbox(store), handler, max_deliveries=2):
        await eventually(lambda: dead_count(kit, 1))
    [(body, headers)] = await kit.dead()
    assert body == b'{"amount": -1}'
    assert headers["onceonly-dead-reason"] == "max-deliveries"
    assert headers["onceonly-error"] == "ValueError: bad amount"
    assert headers["onceonly-message-id"] == "m-1"
    assert headers["onceonly-attempts"].isdigit()
    assert headers["onceonly-source"]
    assert await kit.settled()


async def test_message_without_id_is_dead_lettered_as_invalid_id(kit: Kit, store: Any) -> None:
    """No id and no fallback: dead-lettered unrun as invalid-id (SQS: its MessageId is
    the id, so the message runs)."""
    calls = 0

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        nonlocal calls
        calls += 1

    await kit.send({"n": 1})
    async with kit.consumer(inbox(store), handler):
        if kit.always_has_id:
            await eventually(lambda: _true(calls == 1))
        else:
            await eventually(lambda: dead_count(kit, 1))
    if kit.always_has_id:
        assert await kit.dead() == []
    else:
        [(_, headers)] = await kit.dead()
        assert headers["onceonly-dead-reason"] == "invalid-id"
        assert "onceonly-message-id" not in headers
        assert calls == 0
    assert await kit.settled()


async def test_payload_mismatch_is_dead_lettered(kit: Kit, store: Any) -> None:
    """The same id with another payload is not a duplicate: dead-lettered, not run.
    (The id comes from a payload field: JetStream itself drops a second Nats-Msg-Id.)"""
    seen: list[Any] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        seen.append(payload)

    await kit.send({"event_id": "e-1", "amount": 1})
    async with kit.consumer(inbox(store), handler, message_id="event_id"):
        await eventually(lambda: _true(len(seen) == 1))
        await kit.send({"event_id": "e-1", "amount": 2})
        await eventually(lambda: dead_count(kit, 1))
    [(body, headers)] = await kit.dead()
    assert headers["onceonly-dead-reason"] == "payload-mismatch"
    assert headers["onceonly-message-id"] == "e-1"
    assert body == b'{"event_id": "e-1", "amount": 2}'
    assert seen == [{"event_id": "e-1", "amount": 1}]


async def test_deeply_nested_body_is_dead_lettered_and_the_consumer_goes_on(
    kit: Kit, store: Any
) -> None:
    seen: list[Any] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        seen.append(payload)

    await kit.send(body=nested(10_000), message_id="m-1")
    await kit.send({"ok": True}, message_id="m-2")
    async with kit.consumer(inbox(store), handler):
        await eventually(lambda: dead_count(kit, 1))
        await eventually(lambda: _true(seen == [{"ok": True}]))
    [(_, headers)] = await kit.dead()
    assert headers["onceonly-dead-reason"] == "undecodable"


async def test_dead_letter_error_header_is_bounded_and_clean(kit: Kit, store: Any) -> None:
    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        raise ValueError("line one\nline two\r\x00" + "x" * 5000)

    await kit.send({"n": 1}, message_id="m-1")
    async with kit.consumer(inbox(store), handler, max_deliveries=1):
        await eventually(lambda: dead_count(kit, 1))
    [(_, headers)] = await kit.dead()
    error = headers["onceonly-error"]
    assert error.startswith("ValueError: line one line two")
    assert error.isprintable()
    assert len(error) <= MAX_ERROR_CHARS


# -- lifecycle: one semantics ----------------------------------------------------------


async def test_graceful_stop_lets_the_running_handler_finish(kit: Kit, store: Any) -> None:
    started = asyncio.Event()

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        started.set()
        await asyncio.sleep(0.5)
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", ("slow",))

    await kit.send({"n": 1}, message_id="m-1")
    c = kit.consumer(inbox(store), handler)
    task = asyncio.ensure_future(c.run())
    await asyncio.wait_for(started.wait(), 10)
    await c.stop()
    assert task.done()
    await task
    assert await ledger(store) == ["slow"]
    assert await kit.settled()


async def test_stop_past_shutdown_timeout_rolls_back_and_hands_back(kit: Kit, store: Any) -> None:
    started = asyncio.Event()

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", ("slow",))
        started.set()
        await asyncio.sleep(30)

    await kit.send({"n": 1}, message_id="m-1")
    c = kit.consumer(inbox(store), handler, shutdown_timeout=0.2)
    task = asyncio.ensure_future(c.run())
    await asyncio.wait_for(started.wait(), 10)
    await c.stop()
    await task
    assert await ledger(store) == []
    assert not await kit.settled()  # still the broker's, for the next consumer
    assert await kit.dead() == []


async def test_one_run_at_a_time_and_stop_before_start(kit: Kit, store: Any) -> None:
    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        return None

    c = kit.consumer(inbox(store), handler)
    task = asyncio.ensure_future(c.run())
    await c.stop()  # before run() started: that run returns at once
    await asyncio.wait_for(task, 5)
    c = kit.consumer(inbox(store), handler)
    async with c:
        with pytest.raises(RuntimeError, match="already running"):
            await c.run()
    async with c:  # a stopped consumer runs again
        pass


# -- batches: one transaction, each delivery settled by its own outcome ---------------


def count_batches(store: Any) -> list[int]:
    """Counts the inbox's own transactions (a batch is one; joined savepoints are not)."""
    opened: list[int] = []
    original = store.transaction

    def counting(connection: Any = None, **kw: Any) -> Any:
        if connection is None and "lock_wait" in kw:
            opened.append(1)
        return original(connection, **kw)

    store.transaction = counting
    return opened


BATCH: dict[str, Any] = {"batch_size": 4, "batch_wait": 0.5}


async def test_batch_is_one_transaction_and_runs_duplicates_once(kit: Kit, store: Any) -> None:
    """Four deliveries (one a duplicate) in one batch: one transaction, each key run
    once, every delivery acked. (Ids from a payload field: JetStream drops a second
    Nats-Msg-Id itself.)"""
    calls: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        calls.append(tx.key)
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (tx.key,))

    for key in ("e-1", "e-2", "e-3", "e-2"):
        await kit.send({"event_id": key})
    opened = count_batches(store)
    async with kit.consumer(inbox(store), handler, message_id="event_id", **BATCH):
        await eventually(lambda: _ledger_is(store, ["e-1", "e-2", "e-3"]))
        await asyncio.sleep(0.3)
    assert sorted(calls) == ["e-1", "e-2", "e-3"]
    assert len(opened) == 1
    assert await kit.settled()
    assert await kit.dead() == []


async def test_batch_failing_message_is_retried_alone(kit: Kit, store: Any) -> None:
    """One handler failure in a batch rolls back that message alone: the others commit
    and are acked once; the failed one is redelivered (counted) and then commits."""
    seen: list[tuple[str, int | None]] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        assert tx.delivery is not None
        seen.append((tx.key, tx.delivery.delivery_count))
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (tx.key,))
        if tx.key == "m-2" and tx.delivery.delivery_count == 1:
            raise RuntimeError("flaky")

    for n in (1, 2, 3):
        await kit.send({"n": n}, message_id=f"m-{n}")
    async with kit.consumer(inbox(store), handler, batch_size=3, batch_wait=0.5):
        await eventually(lambda: _ledger_is(store, ["m-1", "m-2", "m-3"]))
        await asyncio.sleep(0.2)
    assert sorted(seen) == [("m-1", 1), ("m-2", 1), ("m-2", 2), ("m-3", 1)]
    assert await kit.settled()
    assert await kit.dead() == []


async def test_batch_poison_delivery_is_dead_lettered_before_the_batch_runs(
    kit: Kit, store: Any
) -> None:
    """A delivery counted past max_deliveries (its first run never ended: the consumer
    stopped past shutdown_timeout) is dead-lettered unrun; the rest of its batch runs."""
    if not kit.counts_deliveries:
        pytest.skip("the broker keeps no delivery count (Kafka: test_kafka.py counts crashes)")
    started = asyncio.Event()

    async def hang(payload: Any, tx: onceonly.AsyncTx) -> None:
        started.set()
        await asyncio.sleep(30)

    await kit.send({"n": 0}, message_id="poison")
    c = kit.consumer(inbox(store), hang, max_deliveries=1, shutdown_timeout=0.1)
    task = asyncio.ensure_future(c.run())
    await asyncio.wait_for(started.wait(), 10)
    await c.stop()
    await task
    calls: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        calls.append(tx.key)

    for n in (1, 2):
        await kit.send({"n": n}, message_id=f"m-{n}")
    options = {"max_deliveries": 1, "batch_size": 3, "batch_wait": 0.5, **kit.takeover}
    async with kit.consumer(inbox(store), handler, **options):
        await eventually(lambda: dead_count(kit, 1))
        await eventually(lambda: _true(len(calls) == 2))
    [(_, headers)] = await kit.dead()
    assert headers["onceonly-dead-reason"] == "max-deliveries"
    assert headers["onceonly-message-id"] == "poison"
    assert sorted(calls) == ["m-1", "m-2"]
    assert await kit.settled()


async def test_batch_whose_store_fails_acks_nothing(kit: Kit, store: Any) -> None:
    """The store goes away under a batch: nothing commits, nothing is acked or counted;
    the next consumer processes every message once."""
    down = True
    tried = asyncio.Event()
    calls: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (tx.key,))
        if down:
            tried.set()
            raise onceonly.StoreUnavailable("connection lost")
        calls.append(tx.key)

    for n in (1, 2, 3):
        await kit.send({"n": n}, message_id=f"m-{n}")
    opened = count_batches(store)
    c = kit.consumer(inbox(store), handler, batch_size=3, batch_wait=0.5)
    async with c:
        await asyncio.wait_for(tried.wait(), 10)
        await eventually(lambda: _true(len(opened) >= 2))  # the whole batch, again
    assert await ledger(store) == []
    assert await kit.dead() == []
    down = False
    async with kit.consumer(inbox(store), handler, batch_size=3, batch_wait=0.5, **kit.takeover):
        await eventually(lambda: _ledger_is(store, ["m-1", "m-2", "m-3"]))
        await asyncio.sleep(0.2)
    assert sorted(calls) == ["m-1", "m-2", "m-3"]
    assert await kit.settled()


# -- message ids ---------------------------------------------------------------------


@pytest.mark.parametrize("key", ["content", "event_id", "callable"])
async def test_message_id_given_is_the_key_over_the_broker_id(
    kit: Kit, store: Any, key: str
) -> None:
    """One body sent twice under two broker ids (a producer that gives every publish a
    fresh id, as aio-pika does): a consumer keyed by content, a field or a callable
    runs it once."""
    keys: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        keys.append(tx.key)

    option: Any = (lambda p: f"evt:{p['event_id']}") if key == "callable" else key
    await kit.send({"event_id": "e-1"}, message_id="broker-1")
    await kit.send({"event_id": "e-1"}, message_id="broker-2")
    async with kit.consumer(inbox(store), handler, message_id=option):
        await eventually(lambda: kit.settled())
        await asyncio.sleep(0.3)
    assert len(keys) == 1
    assert keys[0] not in ("broker-1", "broker-2")
    assert await kit.dead() == []


@pytest.mark.parametrize("path", ["field", "callable"])
async def test_message_id_value_must_be_a_string_or_an_int(kit: Kit, store: Any, path: str) -> None:
    """A field's value or a callable's result: a string is the key as is, an int its
    decimal text; an object, a list, a float, a bool is refused as ``invalid-id`` (an
    object's key order would give one event two keys), the same on both paths."""
    keys: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        keys.append(tx.key)

    option: Any = (lambda p: p["event_id"]) if path == "callable" else "event_id"
    values: list[Any] = [{"order": "o-1", "line": 1}, ["o", 1], 1.5, True, "e-1", 7]
    for i, value in enumerate(values):
        await kit.send({"event_id": value}, message_id=f"broker-{i}")
    async with kit.consumer(inbox(store), handler, message_id=option):
        await eventually(lambda: dead_count(kit, 4))
        await eventually(lambda: _true(len(keys) == 2))
        await eventually(lambda: kit.settled())
    assert sorted(keys) == ["7", "e-1"]
    reasons = [h["onceonly-dead-reason"] for _, h in await kit.dead()]
    assert reasons == ["invalid-id"] * 4


async def test_message_ids_fallback_takes_the_broker_id_first(kit: Kit, store: Any) -> None:
    """MessageIds(fallback=...): the broker's id first (two ids: two runs), the fallback
    only for a message without one."""
    from onceonly.brokers import MessageIds

    keys: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        keys.append(tx.key)

    await kit.send({"event_id": "e-1"}, message_id="broker-1")
    await kit.send({"event_id": "e-1"}, message_id="broker-2")
    await kit.send({"event_id": "e-9"})
    ids = MessageIds(fallback="event_id")
    async with kit.consumer(inbox(store), handler, message_id=ids):
        await eventually(lambda: _true(len(keys) == 3))
        await eventually(lambda: kit.settled())
    assert sorted(keys) == ["broker-1", "broker-2", "e-9"]


# -- bodies --------------------------------------------------------------------------


async def test_body_that_is_not_json_is_dead_lettered_as_undecodable(kit: Kit, store: Any) -> None:
    """A body without a non-JSON content type that does not parse: dead-lettered with the
    decode error, the handler never sees it; the next message runs."""
    calls: list[Any] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        calls.append(payload)

    await kit.send(body=b'{"id": 1, oops', message_id="m-bad")
    await kit.send({"id": 2}, message_id="m-good")
    async with kit.consumer(inbox(store), handler):
        await eventually(lambda: dead_count(kit, 1))
        await eventually(lambda: _true(len(calls) == 1))
    [(body, headers)] = await kit.dead()
    assert body == b'{"id": 1, oops'
    assert headers["onceonly-dead-reason"] == "undecodable"
    assert "JSONDecodeError" in headers["onceonly-error"]
    assert calls == [{"id": 2}]
