# SPDX-License-Identifier: MIT
"""NATS JetStream publisher and consumer against a real server (one stream per test)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo, StreamConfig

import onceonly
from onceonly.brokers.nats import NatsConsumer, NatsPublisher
from onceonly.errors import ConfigurationError, PublishError
from onceonly.inbox import AsyncTx
from onceonly.messaging import OutboxMessage
from tests.conftest import unavailable

pytestmark = pytest.mark.timeout(30)

NATS_URL = os.environ.get("ONCEONLY_TEST_NATS", "nats://127.0.0.1:4222")
DURABLE = "worker"


@pytest.fixture
async def nc() -> AsyncIterator[Client]:
    client = Client()
    try:
        await asyncio.wait_for(
            client.connect(NATS_URL, connect_timeout=2, max_reconnect_attempts=1), 5
        )
        await client.jetstream().account_info()
    except (OSError, asyncio.TimeoutError, nats.errors.Error):
        with contextlib.suppress(Exception):
            await client.close()
        unavailable(f"NATS JetStream at {NATS_URL}")
    yield client
    await client.close()


@dataclass
class Env:
    """This test's stream (``OO_<tag>``) and subject (``oo.<tag>.events``)."""

    js: JetStreamContext
    tag: str
    stream: str
    subject: str

    @property
    def dead_stream(self) -> str:
        return f"{self.stream}_dead"

    @property
    def dead_subject(self) -> str:
        return f"{self.subject}.dead"

    async def send(self, payload: Any, msg_id: str | None = None) -> None:
        headers = {"Nats-Msg-Id": msg_id} if msg_id else None
        await self.js.publish(self.subject, json.dumps(payload).encode(), headers=headers)

    async def info(self) -> ConsumerInfo:
        return await self.js.consumer_info(self.stream, DURABLE)

    async def dead_letters(self) -> list[Msg]:
        try:
            info = await self.js.stream_info(self.dead_stream)
        except nats.js.errors.NotFoundError:
            return []
        return [
            await self.js.get_msg(self.dead_stream, seq)
            for seq in range(info.state.first_seq, info.state.last_seq + 1)
            if info.state.messages
        ]


@pytest.fixture
async def env(nc: Client) -> AsyncIterator[Env]:
    tag = uuid.uuid4().hex[:12]
    js = nc.jetstream()
    e = Env(js, tag, f"OO_{tag}", f"oo.{tag}.events")
    await js.add_stream(name=e.stream, subjects=[e.subject])
    yield e
    for name in (e.stream, e.dead_stream):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(name)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Any]:
    s = onceonly.open_async_store(f"sqlite:///{tmp_path}/x.db")
    await s.migrate()
    async with s.transaction() as tx:
        await tx.execute("CREATE TABLE ledger (id TEXT NOT NULL)")
    yield s
    await s.close()


def committed_ledger(tmp_path: Path) -> list[str]:
    """The ledger as another connection sees it: only committed rows."""
    with contextlib.closing(sqlite3.connect(tmp_path / "x.db")) as conn:
        return [row[0] for row in conn.execute("SELECT id FROM ledger ORDER BY id")]


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 8.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def settled(env: Env, deliveries: int | None = None) -> bool:
    """Nothing pending or unacked on the durable (after ``deliveries`` deliveries)."""
    info = await env.info()
    done = info.num_pending == 0 and info.num_ack_pending == 0
    if deliveries is not None:
        done = done and info.delivered.consumer_seq == deliveries
    return done


def consumer(env: Env, store: Any, handler: Any, **options: Any) -> NatsConsumer:
    """A consumer of this test's stream; short polls so that stop() returns quickly."""
    inbox = options.pop("inbox", None) or onceonly.AsyncInbox(
        store, consumer="billing", max_attempts=options.pop("max_attempts", 5)
    )
    options.setdefault("poll_timeout", 0.25)
    return NatsConsumer(
        inbox,
        handler,
        url=NATS_URL,
        stream=env.stream,
        subject=env.subject,
        durable=DURABLE,
        **options,
    )


def message(env: Env, payload: Any, **kw: Any) -> OutboxMessage:
    return OutboxMessage(id=str(uuid.uuid4()), topic="events", payload=json.dumps(payload), **kw)


# -- publisher -----------------------------------------------------------------------


async def test_publish_confirms_with_message_id_as_nats_msg_id(env: Env) -> None:
    """publish waits for the PubAck; the outbox id is the Nats-Msg-Id JetStream dedups on."""
    msg = message(env, {"amount": 5}, key="acct-1", headers={"trace": "t-1"})
    async with NatsPublisher(NATS_URL, subject_prefix=f"oo.{env.tag}.") as pub:
        await pub.publish(msg)
        stored = await env.js.get_msg(env.stream, 1)  # confirmed: already in the stream
        assert stored.headers is not None
        assert stored.headers["Nats-Msg-Id"] == msg.id
        assert stored.headers["onceonly-key"] == "acct-1"
        assert stored.headers["trace"] == "t-1"
        assert stored.headers["Content-Type"] == "application/json"
        assert json.loads(stored.data) == {"amount": 5}
        await pub.publish(msg)  # the relay re-publishing the same row
    info = await env.js.stream_info(env.stream)
    assert info.state.messages == 1


async def test_publish_to_subject_without_stream_raises(env: Env) -> None:
    """No stream captures the subject: PublishError, caused by NoStreamResponseError."""
    async with NatsPublisher(NATS_URL, subject_prefix=f"oo.{env.tag}.nostream.") as pub:
        with pytest.raises(PublishError) as err:
            await pub.publish(message(env, {"a": 1}))
    assert isinstance(err.value.__cause__, nats.js.errors.NoStreamResponseError)


async def test_publish_refused_by_expected_stream_raises(env: Env) -> None:
    """A stream other than the expected one refuses the message: PublishError."""
    async with NatsPublisher(
        NATS_URL, subject_prefix=f"oo.{env.tag}.", stream=f"{env.stream}_other"
    ) as pub:
        with pytest.raises(PublishError):
            await pub.publish(message(env, {"a": 1}))
    assert (await env.js.stream_info(env.stream)).state.messages == 0


async def test_publish_without_server_raises() -> None:
    """An unreachable server: PublishError within the timeout, not a hang."""
    pub = NatsPublisher("nats://127.0.0.1:1", timeout=1.0)
    started = time.monotonic()
    with pytest.raises(PublishError):
        await pub.publish(OutboxMessage(id="m-1", topic="t", payload="{}"))
    assert time.monotonic() - started < 5
    await pub.close()


async def test_publisher_reconnects_after_connection_loss(env: Env) -> None:
    """After its connection closed, the next publish opens a new one."""
    async with NatsPublisher(NATS_URL, subject_prefix=f"oo.{env.tag}.") as pub:
        await pub.publish(message(env, {"n": 1}))
        first = pub._connection
        assert first is not None
        await first.close()
        await pub.publish(message(env, {"n": 2}))
        assert pub._connection is not first
    assert (await env.js.stream_info(env.stream)).state.messages == 2


async def test_publisher_on_a_given_connection(env: Env, nc: Client) -> None:
    """A caller's connection is used, and left open by close()."""
    pub = NatsPublisher(connection=nc, subject_prefix=f"oo.{env.tag}.")
    await pub.publish(message(env, {"n": 1}))
    await pub.close()
    assert nc.is_connected
    assert (await env.js.stream_info(env.stream)).state.messages == 1


# -- consumer ------------------------------------------------------------------------


def test_dead_letter_subject_must_not_loop_back(store: Any) -> None:
    """A dead-letter subject the consumer's own filter matches is refused up front."""
    inbox = onceonly.AsyncInbox(store, consumer="billing")

    async def handler(payload: Any, tx: AsyncTx) -> None: ...

    with pytest.raises(ConfigurationError):
        NatsConsumer(
            inbox,
            handler,
            url=NATS_URL,
            stream="S",
            subject="orders.>",
            durable="d",
            dead_letter="orders.dead",
        )


async def test_processes_once_and_acks_only_after_commit(
    env: Env, store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler's row is committed before the ack; the message is unacked while it runs."""
    unacked_during: list[int] = []
    committed_at_ack: list[list[str]] = []
    real_ack = Msg.ack

    async def ack(self: Msg) -> None:
        committed_at_ack.append(committed_ledger(tmp_path))
        await real_ack(self)

    monkeypatch.setattr(Msg, "ack", ack)

    async def handler(payload: Any, tx: AsyncTx) -> str:
        unacked_during.append((await env.info()).num_ack_pending)
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (payload["id"],))
        return "ok"

    await env.send({"id": "pay-1"}, msg_id="m-1")
    async with consumer(env, store, handler):
        await eventually(lambda: settled(env, deliveries=1))
    assert unacked_during == [1]
    assert committed_at_ack == [["pay-1"]]
    assert committed_ledger(tmp_path) == ["pay-1"]


async def test_duplicate_message_is_acked_without_running_the_handler(
    env: Env, store: Any, tmp_path: Path
) -> None:
    """A second broker message with the same id is acked, the handler not run again."""
    await env.js.update_stream(
        StreamConfig(name=env.stream, subjects=[env.subject], duplicate_window=0.1)
    )
    calls: list[str] = []

    async def handler(payload: Any, tx: AsyncTx) -> str:
        calls.append(tx.key)
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (payload["id"],))
        return "ok"

    async with consumer(env, store, handler):
        await env.send({"id": "pay-1"}, msg_id="m-1")
        await eventually(lambda: settled(env, deliveries=1))
        await asyncio.sleep(0.2)  # past JetStream's duplicate window: a second message
        await env.send({"id": "pay-1"}, msg_id="m-1")
        await eventually(lambda: settled(env, deliveries=2))
    assert (await env.js.stream_info(env.stream)).state.messages == 2
    assert calls == ["m-1"]
    assert committed_ledger(tmp_path) == ["pay-1"]


async def test_poison_message_is_dead_lettered_then_acked(env: Env, store: Any) -> None:
    """max_attempts failures: published to the dead-letter subject with headers, then acked."""
    calls = 0

    async def handler(payload: Any, tx: AsyncTx) -> None:
        nonlocal calls
        calls += 1
        raise ValueError("bad amount")

    body = {"id": "pay-1", "amount": -1}
    await env.send(body, msg_id="m-1")
    async with consumer(env, store, handler, max_attempts=2):
        await eventually(lambda: settled(env, deliveries=3))
        await asyncio.sleep(0.3)  # nothing comes back
        assert await settled(env, deliveries=3)
    assert calls == 2
    dead = await env.dead_letters()
    assert len(dead) == 1
    assert json.loads(dead[0].data) == body
    headers = dead[0].headers or {}
    assert dead[0].subject == env.dead_subject
    assert headers["onceonly-dead-reason"] == "dead-lettered"
    assert "bad amount" in headers["onceonly-error"]
    assert headers["onceonly-attempts"] == "2"
    assert headers["onceonly-message-id"] == "m-1"


async def test_dead_letter_publish_failure_leaves_message_for_redelivery(
    env: Env, store: Any
) -> None:
    """While the dead-letter stream is missing the message is nak'ed, not dropped."""

    async def handler(payload: Any, tx: AsyncTx) -> None: ...

    async with consumer(env, store, handler):
        await env.js.delete_stream(env.dead_stream)  # created at start; now gone
        await env.send({"id": "pay-1"})  # no id: must be dead-lettered
        await eventually(lambda: _delivered_at_least(env, 3))
        assert (await env.info()).num_ack_pending == 1
        await env.js.add_stream(name=env.dead_stream, subjects=[env.dead_subject])
        await eventually(lambda: settled(env))
    assert len(await env.dead_letters()) == 1


async def _delivered_at_least(env: Env, n: int) -> bool:
    return (await env.info()).delivered.consumer_seq >= n


@pytest.mark.timeout(20)
async def test_long_handler_is_not_redelivered_thanks_to_heartbeat(env: Env, store: Any) -> None:
    """ack_wait=1 s and a 3 s handler: in-progress signals keep it from redelivery."""

    async def handler(payload: Any, tx: AsyncTx) -> str:
        await asyncio.sleep(3)
        return "slow"

    await env.send({"id": "pay-1"}, msg_id="m-1")
    async with consumer(env, store, handler, ack_wait=1.0):
        assert (await env.info()).config.ack_wait == 1.0
        await eventually(lambda: settled(env, deliveries=1), timeout=10)
    assert (await env.info()).delivered.consumer_seq == 1  # delivered once


async def test_stop_finishes_in_flight_handler_and_acks(
    env: Env, store: Any, tmp_path: Path
) -> None:
    """stop() waits for the running handler, commits and acks it, then returns."""
    started = asyncio.Event()
    finished: list[str] = []

    async def handler(payload: Any, tx: AsyncTx) -> str:
        started.set()
        await asyncio.sleep(1.0)
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (payload["id"],))
        finished.append(payload["id"])
        return "ok"

    c = consumer(env, store, handler)
    task = asyncio.ensure_future(c.run())
    await env.send({"id": "pay-1"}, msg_id="m-1")
    await asyncio.wait_for(started.wait(), 5)
    await c.stop()
    assert finished == ["pay-1"]
    await task
    assert committed_ledger(tmp_path) == ["pay-1"]
    await eventually(lambda: settled(env, deliveries=1))


async def test_cancelled_run_hands_messages_back(env: Env, store: Any, tmp_path: Path) -> None:
    """Cancelling run() rolls the handler back and naks, so the next consumer gets it soon."""
    started = asyncio.Event()

    async def slow(payload: Any, tx: AsyncTx) -> None:
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", ("slow",))
        started.set()
        await asyncio.sleep(30)

    async def fast(payload: Any, tx: AsyncTx) -> None:
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", ("fast",))

    await env.send({"id": "pay-1"}, msg_id="m-1")
    task = asyncio.ensure_future(consumer(env, store, slow).run())
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with consumer(env, store, fast):  # ack_wait is 30 s: only a nak makes this quick
        await eventually(lambda: settled(env, deliveries=2), timeout=5)
    assert committed_ledger(tmp_path) == ["fast"]


async def test_fetch_returning_more_than_asked_is_handled(env: Env, store: Any) -> None:
    """A fetch that returns extra queued messages neither crashes nor exceeds the slots."""
    for i in range(20):
        await env.send({"i": i}, msg_id=f"m-{i}")
    running, most = 0, 0

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.2)
        running -= 1

    c = consumer(env, store, handler, batch=2)
    task = asyncio.ensure_future(c.run())
    await eventually(lambda: _has_sub(c))
    # nats-py's fetch(n) also hands over every reply already queued (pull requests
    # answered together after a reconnect), so it can return more than n. Make every
    # fetch do so, with real messages from the server.
    sub = c._sub
    assert sub is not None
    real_fetch = sub.fetch

    async def greedy_fetch(batch: int = 1, timeout: float | None = 5, **kw: Any) -> Any:
        return await real_fetch(batch + 4 if batch > 0 else batch, timeout=timeout, **kw)

    sub.fetch = greedy_fetch  # type: ignore[method-assign]
    await eventually(lambda: settled(env), timeout=15)
    assert not task.done(), task.exception() if task.done() else None
    await c.stop()
    await task
    assert most <= 2


async def _has_sub(c: NatsConsumer) -> bool:
    return c._sub is not None


# -- settlement: every delivery ends acked, retried with backoff, or dead-lettered ---------


@pytest.mark.parametrize(
    "transient",
    [
        lambda: onceonly.StoreUnavailable("connection lost"),
        lambda: onceonly.InFlight("held elsewhere", retry_after=0.01),
    ],
    ids=["store-unavailable", "in-flight"],
)
async def test_transient_errors_are_retried_without_counting(
    env: Env, store: Any, tmp_path: Path, transient: Callable[[], Exception]
) -> None:
    """Four StoreUnavailable/InFlight: retried with backoff, no redelivery, no attempt used."""
    seen: list[tuple[int | None, int]] = []

    async def handler(payload: Any, tx: AsyncTx) -> None:
        seen.append((tx.delivery.delivery_count if tx.delivery else None, tx.attempt))
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (tx.key,))

    inbox = onceonly.AsyncInbox(store, consumer="billing")
    real = inbox.process
    failures = [transient() for _ in range(4)]

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return await real(*args, **kwargs)

    inbox.process = flaky  # type: ignore[method-assign]
    await env.send({"n": 1}, msg_id="m-1")
    async with consumer(env, store, handler, inbox=inbox, retry_delay=0.05, max_deliveries=2):
        await eventually(lambda: settled(env, deliveries=1))
    assert seen == [(1, 1)]  # delivered once: JetStream's count never moved
    assert committed_ledger(tmp_path) == ["m-1"]
    assert await env.dead_letters() == []


@pytest.mark.parametrize("case", ["too-large", "unencodable"])
async def test_result_too_large_or_unencodable_is_dead_lettered(
    env: Env, store: Any, case: str
) -> None:
    """TooLarge / EncodingError from the inbox: dead-lettered after one run, not retried."""
    calls: list[str] = []

    async def handler(payload: Any, tx: AsyncTx) -> Any:
        calls.append(tx.key)
        return "x" * 100 if case == "too-large" else object()

    inbox = onceonly.AsyncInbox(store, consumer="billing", max_result_bytes=16)
    await env.send({"n": 1}, msg_id="m-1")
    async with consumer(env, store, handler, inbox=inbox):
        await eventually(lambda: settled(env, deliveries=1))
    [dead] = await env.dead_letters()
    assert (dead.headers or {})["onceonly-dead-reason"] == case
    assert calls == ["m-1"]


async def test_dead_letter_error_header_is_bounded_and_clean(env: Env, store: Any) -> None:
    """An error text with NUL, CR/LF, a lone surrogate and 3000 characters: a safe header."""
    calls = 0

    async def handler(payload: Any, tx: AsyncTx) -> None:
        nonlocal calls
        calls += 1
        raise ValueError("bad\x00amount\r\n\ud800" + "é" * 3000)

    await env.send({"n": 1}, msg_id="m-1")
    async with consumer(env, store, handler, retry_delay=0.01, max_deliveries=2):
        await eventually(lambda: settled(env, deliveries=2))
    [dead] = await env.dead_letters()
    headers = dead.headers or {}
    error = headers["onceonly-error"]
    assert isinstance(error, str)  # ASCII: a non-ASCII value would come back as a Header
    assert error.startswith("ValueError: bad amount  \\ufffd\\xe9\\xe9")
    assert error.isascii()
    assert error.isprintable()
    assert len(error) <= 1024
    assert headers["onceonly-dead-reason"] in ("max-deliveries", "dead-lettered")
    assert calls == 2


async def test_worker_killed_by_its_handler_is_dead_lettered_after_max_deliveries(
    env: Env, store: Any, tmp_path: Path
) -> None:
    """A handler that kills the worker (nothing commits): dead-lettered unrun on delivery 4."""
    from tests.brokers._crash_consumer import EXIT_IN_HANDLER, crash_loop, runs

    await env.send({"n": 1}, msg_id="m-poison")
    config = {
        "broker": "nats",
        "url": NATS_URL,
        "stream": env.stream,
        "subject": env.subject,
        "durable": DURABLE,
        "db": str(tmp_path / "x.db"),
        "runs": str(tmp_path / "runs"),
        "max_deliveries": 3,
    }

    async def dead_letters() -> int:
        return len(await env.dead_letters())

    exits = await crash_loop(config, dead_letters)
    assert exits == [EXIT_IN_HANDLER] * 3
    assert runs(tmp_path / "runs") == [1, 2, 3]
    [dead] = await env.dead_letters()
    headers = dead.headers or {}
    assert headers["onceonly-dead-reason"] == "max-deliveries"
    assert headers["onceonly-message-id"] == "m-poison"
    assert committed_ledger(tmp_path) == []
    assert await settled(env, deliveries=4)


async def test_dedup_window_refuses_a_ttl_shorter_than_the_redeliveries(
    env: Env, store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """ttl 60 s against max_deliveries (3) x ack_wait (30 s) = 90 s: refused; a ttl
    that covers it starts without a word."""
    short = onceonly.AsyncInbox(store, consumer="billing", ttl=60)
    c = consumer(env, store, lambda p, tx: None, inbox=short, ack_wait=30, max_deliveries=3,
                 dedup_window="refuse")  # fmt: skip
    with pytest.raises(onceonly.ConfigurationError, match="max_deliveries x ack_wait: 90 s"):
        await asyncio.wait_for(c.run(), 10)
    caplog.set_level("WARNING", logger="onceonly.brokers.nats")
    long = onceonly.AsyncInbox(store, consumer="billing", ttl=120)
    c = consumer(env, store, lambda p, tx: None, inbox=long, ack_wait=30, max_deliveries=3)
    task = asyncio.ensure_future(c.run())
    await asyncio.sleep(0.5)
    await c.stop()
    await asyncio.wait_for(task, 10)
    assert not [r for r in caplog.records if "redelivery horizon" in r.getMessage()]


async def test_dedup_window_reads_the_stream_max_age(env: Env, store: Any) -> None:
    """A stream keeping messages 200 s: a redelivery after consumers were down can come
    that late, later than max_deliveries x ack_wait (90 s) and the ttl (100 s)."""
    await env.js.update_stream(name=env.stream, subjects=[env.subject], max_age=200)
    short = onceonly.AsyncInbox(store, consumer="billing", ttl=100)
    c = consumer(env, store, lambda p, tx: None, inbox=short, ack_wait=30, max_deliveries=3,
                 dedup_window="refuse")  # fmt: skip
    with pytest.raises(onceonly.ConfigurationError, match="max_age: 200 s"):
        await asyncio.wait_for(c.run(), 10)
