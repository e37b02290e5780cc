# SPDX-License-Identifier: MIT
"""The consumer loop's own rules, on the in-memory broker (onceonly.testing): what the
contract suite cannot provoke on a real broker without breaking it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest

import onceonly
from onceonly._core.deadletter import envelope
from onceonly._core.settle import Action, Verdict
from onceonly.brokers._transport import Incoming
from onceonly.testing import MemoryBroker, MemoryConsumer
from tests.conftest import require_postgres

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
async def store() -> AsyncIterator[Any]:
    s = onceonly.open_async_store("memory://")
    yield s
    await s.close()


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def consumer(store: Any, broker: MemoryBroker, handler: Any, **kw: Any) -> MemoryConsumer:
    kw.setdefault("retry_delay", 0.01)
    kw.setdefault("max_backoff", 0.05)
    inbox = onceonly.AsyncInbox(store, consumer="loop")
    return MemoryConsumer(inbox, handler, broker=broker, queue="q", **kw)


def test_envelope_is_one_set_of_headers() -> None:
    """The dead-letter headers: the original ones minus the broker's, plus onceonly-*."""
    v = Verdict(Action.DEAD_LETTER, "dead-lettered", "ValueError: x\ny", attempts=3)
    headers = envelope(
        {"trace": "t", "x-delivery-count": 4, "onceonly-message-id": "old"},
        v,
        None,
        "orders",
        drop=lambda k: k == "x-delivery-count",
    )
    assert headers == {
        "trace": "t",
        "onceonly-dead-reason": "dead-lettered",
        "onceonly-error": "ValueError: x y",
        "onceonly-attempts": "3",
        "onceonly-source": "orders",
    }


async def test_a_failed_dead_letter_is_not_acked_and_comes_back(store: Any) -> None:
    broker = MemoryBroker()
    broker.fail_dead_letters = 2
    broker.send("q", {"n": 1})  # no id: dead-lettered as invalid-id
    async with consumer(store, broker, lambda p, tx: None):
        await eventually(lambda: bool(broker.dead_letters.get("q.dead")))
    [dead] = broker.dead_letters["q.dead"]
    assert dead.headers["onceonly-dead-reason"] == "invalid-id"
    assert [m.deliveries for m in broker.acked["q"]] == [3]  # two failed publishes first
    assert broker.depth("q") == 0


async def crashed_alone(store: Any, key: str, payload: Any, times: int) -> None:
    """Leave ``times`` attempts of ``key`` counted and unfinished, as runs that killed
    their worker leave them (the attempt counted before it ran, nothing after)."""
    inbox = onceonly.AsyncInbox(store, consumer="loop", precount_attempts=True)

    async def dies(payload: Any, tx: onceonly.AsyncTx) -> None:
        raise asyncio.CancelledError  # the process ends here: nothing is recorded

    for _ in range(times):
        with contextlib.suppress(asyncio.CancelledError):
            await inbox.process(key, payload, dies)


async def test_a_delivery_past_max_deliveries_is_dead_lettered_unrun(store: Any) -> None:
    """Counted past max_deliveries by the broker, with max_deliveries - 1 of its own
    runs counted by the store (the first crash, as a fresh delivery, is not): poison."""
    broker = MemoryBroker()
    calls = 0

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        nonlocal calls
        calls += 1

    await crashed_alone(store, "m-1", {"n": 1}, 2)
    broker.send("q", {"n": 1}, message_id="m-1")
    broker.queue("q").ready[0].deliveries = 3  # crashed three times already
    async with consumer(store, broker, handler, max_deliveries=3):
        await eventually(lambda: bool(broker.dead_letters.get("q.dead")))
    [dead] = broker.dead_letters["q.dead"]
    assert dead.headers["onceonly-dead-reason"] == "max-deliveries"
    assert dead.headers["onceonly-message-id"] == "m-1"
    assert calls == 0


async def test_a_delivery_counted_for_other_crashes_still_runs_alone(store: Any) -> None:
    """Counted past max_deliveries by the broker, but the store counted fewer than
    max_deliveries - 1 runs of its own: the count holds crashes of messages it was
    held with, so it runs (alone, its attempt counted first) and commits."""
    broker = MemoryBroker()
    calls: list[int] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        calls.append(tx.attempt)

    await crashed_alone(store, "m-1", {"n": 1}, 1)
    broker.send("q", {"n": 1}, message_id="m-1")
    broker.queue("q").ready[0].deliveries = 5  # held by workers that crashed
    async with consumer(store, broker, handler, max_deliveries=3):
        await eventually(lambda: broker.depth("q") == 0 and bool(broker.acked.get("q")))
    assert calls == [2]  # the crash it had was counted; this is its second attempt
    assert not broker.dead_letters.get("q.dead")


async def test_a_redelivered_delivery_runs_with_nothing_else_running(store: Any) -> None:
    """A redelivered delivery waits for the running handlers and no other starts while
    it runs: a crash during it takes no other message in flight with it."""
    broker = MemoryBroker()
    running: set[str] = set()
    overlaps: list[tuple[str, set[str]]] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        if payload.get("suspect") or running & {"s"}:
            overlaps.append((tx.key, set(running)))
        running.add(tx.key)
        await asyncio.sleep(0.05)
        running.discard(tx.key)

    for i in range(4):
        broker.send("q", {"n": i}, message_id=f"f-{i}")
    broker.send("q", {"n": 9, "suspect": True}, message_id="s")
    broker.queue("q").ready[-1].deliveries = 2  # redelivered
    for i in range(4, 8):
        broker.send("q", {"n": i}, message_id=f"f-{i}")
    async with consumer(store, broker, handler, concurrency=4):
        await eventually(lambda: len(broker.acked.get("q", [])) == 9)
    assert ("s", set()) in overlaps
    assert all(not others for _, others in overlaps), overlaps


async def test_concurrency_counts_a_batch_as_one_transaction(store: Any) -> None:
    """concurrency=2, batch_size=4: four deliveries may be in flight (room for a batch),
    but at most two transactions run at once, however small the batches are."""
    broker = MemoryBroker()
    running = most = 0

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.15)
        running -= 1

    async with consumer(store, broker, handler, concurrency=2, batch_size=4, batch_wait=0):
        for i in range(6):  # one at a time: each a batch of its own
            broker.send("q", {"n": i}, message_id=f"m-{i}")
            await asyncio.sleep(0.02)
        await eventually(lambda: len(broker.acked.get("q", [])) == 6)
    assert most == 2


@pytest.mark.parametrize(("concurrency", "warned"), [(4, False), (12, True)])
async def test_pool_warning_counts_transactions_not_batch_size(
    caplog: pytest.LogCaptureFixture, concurrency: int, warned: bool
) -> None:
    """A batch holds one connection: concurrency=4, batch_size=16 fits a pool of 10;
    concurrency=12 does not."""
    pg = onceonly.open_async_store(require_postgres(), max_size=10)
    try:
        broker = MemoryBroker()

        async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
            pass

        inbox = onceonly.AsyncInbox(pg, consumer="loop")
        c = MemoryConsumer(
            inbox, handler, broker=broker, queue="q", concurrency=concurrency, batch_size=16
        )
        with caplog.at_level(logging.WARNING):
            async with c:
                pass
    finally:
        await pg.close()
    said = [r.getMessage() for r in caplog.records if "pool has" in r.getMessage()]
    assert bool(said) is warned, said


async def test_concurrency_bounds_the_running_handlers(store: Any) -> None:
    broker = MemoryBroker()
    running = most = done = 0

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        nonlocal running, most, done
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.02)
        running -= 1
        done += 1

    for i in range(20):
        broker.send("q", {"i": i}, message_id=f"m-{i}")
    async with consumer(store, broker, handler, concurrency=3):
        await eventually(lambda: done == 20)
    assert most == 3


async def test_an_ack_that_fails_is_retried_not_lost(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catch-all: a settlement that raises hands the delivery back; the inbox then
    replays it and the next ack goes through."""
    from onceonly.brokers._memory import MemoryTransport

    broker = MemoryBroker()
    calls = 0
    real_ack = MemoryTransport.ack
    failures = [RuntimeError("connection lost")]

    async def ack(self: MemoryTransport, d: Incoming) -> None:
        if failures:
            raise failures.pop()
        await real_ack(self, d)

    monkeypatch.setattr(MemoryTransport, "ack", ack)

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        nonlocal calls
        calls += 1

    broker.send("q", {"n": 1}, message_id="m-1")
    async with consumer(store, broker, handler):
        await eventually(lambda: bool(broker.acked.get("q")))
    assert calls == 1  # the second delivery replayed the committed outcome
    assert [m.deliveries for m in broker.acked["q"]] == [2]


async def test_leases_of_running_handlers_are_extended(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onceonly.brokers._memory import MemoryTransport

    extended: list[list[str | None]] = []

    async def extend(self: MemoryTransport, ds: Sequence[Incoming]) -> None:
        extended.append([d.broker_id for d in ds])

    monkeypatch.setattr(MemoryTransport, "extend", extend)
    monkeypatch.setattr(MemoryTransport, "extend_every", 0.05)
    broker = MemoryBroker()
    finished = asyncio.Event()

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        await asyncio.sleep(0.3)
        finished.set()

    broker.send("q", {"n": 1}, message_id="m-1")
    async with consumer(store, broker, handler):
        await asyncio.wait_for(finished.wait(), 5)
    assert ["m-1"] in extended


async def _run_and_cancel(c: MemoryConsumer, started: Awaitable[Any]) -> None:
    task = asyncio.ensure_future(c.run())
    await asyncio.wait_for(started, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancelled_run_hands_its_deliveries_back(store: Any) -> None:
    broker = MemoryBroker()
    started = asyncio.Event()

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        started.set()
        await asyncio.sleep(30)

    broker.send("q", {"n": 1}, message_id="m-1")
    await _run_and_cancel(consumer(store, broker, handler), started.wait())
    assert len(broker.queue("q").ready) == 1
    assert broker.acked.get("q") is None


async def test_a_lone_message_waits_only_batch_wait(store: Any) -> None:
    """With batch_size=32 a single message is not held for a full batch: it runs after
    about batch_wait, and later arrivals form batches of what has already arrived."""
    broker = MemoryBroker()
    done: list[float] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        done.append(time.monotonic())

    async with consumer(store, broker, handler, batch_size=32, batch_wait=0.05) as c:
        assert c.concurrency >= 32  # room for one batch at least
        sent = time.monotonic()
        broker.send("q", body=b'{"n": 1}', message_id="m-1")
        await eventually(lambda: len(done) == 1)
        assert done[0] - sent < 1.0


def test_batch_settings_are_checked(store: Any) -> None:
    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        return None

    for bad in ({"batch_size": 0}, {"batch_wait": -1.0}):
        with pytest.raises(onceonly.ConfigurationError):
            consumer(store, MemoryBroker(), handler, **bad)


async def test_a_body_with_a_non_json_content_type_reaches_the_handler_as_bytes() -> None:
    """content-type application/octet-stream: the body is bytes, never parsed."""
    store = onceonly.open_async_store("memory://")
    broker = MemoryBroker()
    got: list[Any] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        got.append(payload)

    headers = {"content-type": "application/octet-stream"}
    broker.send("in", body=b"\x00{not json", message_id="m-1", headers=headers)
    inbox = onceonly.AsyncInbox(store, consumer="c")
    async with MemoryConsumer(inbox, handler, broker=broker, queue="in"):
        for _ in range(200):
            if got:
                break
            await asyncio.sleep(0.01)
    assert got == [b"\x00{not json"]


@pytest.mark.parametrize("concurrency", [16, 10])
async def test_concurrency_above_the_pool_is_warned_once_at_start(
    concurrency: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Atomic inbox on PostgreSQL (pool of 10) under a consumer of 16 handlers: one
    WARNING at start naming both numbers and the fix; none at 10, none on a restart."""
    import logging

    from tests.conftest import PG_URL, drop_pg_table, require_postgres, unique_table

    require_postgres()
    table = unique_table()
    store = onceonly.open_async_store(PG_URL, table=table)
    broker = MemoryBroker()

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        return None

    try:
        await store.migrate()
        inbox = onceonly.AsyncInbox(store, consumer="c")
        c = MemoryConsumer(inbox, handler, broker=broker, queue="in", concurrency=concurrency)
        with caplog.at_level(logging.WARNING, logger="onceonly"):
            for _ in range(2):  # a consumer that runs again does not warn again
                async with c:
                    pass
    finally:
        await store.close()
        drop_pg_table(table)
    warned = [r.getMessage() for r in caplog.records if "pool" in r.getMessage()]
    if concurrency == 10:
        assert warned == []
    else:
        [line] = warned
        assert "16" in line and "10" in line and "max_size" in line
