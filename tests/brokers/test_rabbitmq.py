# SPDX-License-Identifier: MIT
"""RabbitMQ publisher and consumer, on the real broker (onceonly.brokers.rabbitmq).

Every test uses its own uniquely named queues and deletes them at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aio_pika
import aiormq
import pytest
from pamqp.commands import Basic

import onceonly
from onceonly.brokers.rabbitmq import RabbitMQConsumer, RabbitMQPublisher
from onceonly.brokers.rabbitmq._wire import translate as _translate
from onceonly.messaging import OutboxMessage
from tests.conftest import unavailable

AMQP_URL = os.environ.get("ONCEONLY_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/")

pytestmark = pytest.mark.timeout(30)


class Broker:
    """The test's side of RabbitMQ: unique queues, raw publishes and reads, cleanup."""

    def __init__(self, connection: aio_pika.abc.AbstractConnection) -> None:
        self.connection = connection
        self.names: list[str] = []
        self.channel: aio_pika.abc.AbstractChannel | None = None

    async def chan(self) -> aio_pika.abc.AbstractChannel:
        if self.channel is None or self.channel.is_closed:
            self.channel = await self.connection.channel()
        return self.channel

    def name(self, prefix: str = "q") -> str:
        """A fresh queue name; it and its ``.dead`` queue are deleted after the test."""
        name = f"onceonly-test-{prefix}-{uuid.uuid4().hex[:10]}"
        self.names += [name, f"{name}.dead"]
        return name

    async def declare(self, name: str, *, quorum: bool = True) -> None:
        args = {"x-queue-type": "quorum"} if quorum else None
        await (await self.chan()).declare_queue(name, durable=True, arguments=args)

    async def publish(
        self, queue: str, payload: Any, *, message_id: str | None = None, **headers: Any
    ) -> None:
        body = payload if isinstance(payload, bytes) else onceonly_json(payload)
        message = aio_pika.Message(body, message_id=message_id, headers=headers or None)
        await (await self.chan()).default_exchange.publish(message, routing_key=queue)

    async def count(self, queue: str) -> int:
        """Messages ready in ``queue`` (unacked ones are not counted); -1: no such queue."""
        channel = await self.connection.channel()
        try:
            declared = await channel.declare_queue(queue, passive=True)
            return int(declared.declaration_result.message_count or 0)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return -1
        finally:
            if not channel.is_closed:
                await channel.close()

    async def consumers(self, queue: str) -> int:
        """Consumers attached to ``queue``; -1: no such queue."""
        channel = await self.connection.channel()
        try:
            declared = await channel.declare_queue(queue, passive=True)
            return int(declared.declaration_result.consumer_count or 0)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return -1
        finally:
            if not channel.is_closed:
                await channel.close()

    async def take(self, queue: str) -> list[aio_pika.abc.AbstractIncomingMessage]:
        """Every message ready in ``queue``, acked."""
        q = await (await self.chan()).get_queue(queue)
        taken = []
        while (message := await q.get(fail=False, timeout=5)) is not None:
            await message.ack()
            taken.append(message)
        return taken

    async def cleanup(self) -> None:
        channel = await self.connection.channel()
        for name in self.names:
            with contextlib.suppress(Exception):
                await channel.queue_delete(name)
        await self.connection.close()


def onceonly_json(payload: Any) -> bytes:
    import json

    return json.dumps(payload).encode()


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    try:
        connection = await asyncio.wait_for(aio_pika.connect(AMQP_URL), 5)
    except Exception:
        unavailable(f"RabbitMQ at {AMQP_URL}")
    b = Broker(connection)
    yield b
    await b.cleanup()


class Db:
    """An async SQLite store plus a ``ledger`` business table in the same file."""

    def __init__(self, path: Path, store: Any) -> None:
        self.path = path
        self.store = store

    def ledger(self) -> list[str]:
        with contextlib.closing(sqlite3.connect(self.path)) as conn:
            return [row[0] for row in conn.execute("SELECT id FROM ledger ORDER BY id")]

    def inbox(self, **options: Any) -> onceonly.AsyncInbox:
        return onceonly.AsyncInbox(self.store, consumer="rabbit", **options)


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Db]:
    path = tmp_path / "x.db"
    store = onceonly.open_async_store(f"sqlite:///{path}")
    await store.migrate()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE ledger (id TEXT PRIMARY KEY)")
        conn.commit()
    yield Db(path, store)
    await store.close()


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def until_count(broker: Broker, queue: str, n: int, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while await broker.count(queue) != n:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{queue} never held {n} messages")
        await asyncio.sleep(0.05)


# --- publisher ---------------------------------------------------------------------------


async def test_publish_is_confirmed_and_carries_the_message_id(broker: Broker) -> None:
    """A confirmed publish arrives with message.id as the AMQP message_id, key and headers."""
    queue = broker.name()
    await broker.declare(queue)
    message = OutboxMessage(
        onceonly.uuid7(), queue, '{"amount": 5}', key="acct-1", headers={"trace": "t-1"}
    )
    async with RabbitMQPublisher(AMQP_URL) as publisher:
        await publisher.publish(message)
    [got] = await broker.take(queue)
    assert got.message_id == message.id
    assert got.body == b'{"amount": 5}'
    assert got.content_type == "application/json"
    assert got.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert got.headers["onceonly-key"] == "acct-1"
    assert got.headers["trace"] == "t-1"


async def test_unroutable_publish_raises_and_publisher_goes_on(broker: Broker) -> None:
    """A message no queue receives (basic.return) raises PublishError; the next one works."""
    missing, queue = broker.name("missing"), broker.name()
    await broker.declare(queue)
    async with RabbitMQPublisher(AMQP_URL) as publisher:
        with pytest.raises(onceonly.PublishError, match="unroutable") as info:
            await publisher.publish(OutboxMessage(onceonly.uuid7(), missing, "{}"))
        assert isinstance(info.value.__cause__, aiormq.exceptions.PublishError)
        await publisher.publish(OutboxMessage(onceonly.uuid7(), queue, "{}"))
    assert len(await broker.take(queue)) == 1


async def test_missing_exchange_raises(broker: Broker) -> None:
    """Publishing to a named exchange that does not exist raises PublishError."""
    async with RabbitMQPublisher(AMQP_URL, exchange=broker.name("nox")) as publisher:
        with pytest.raises(onceonly.PublishError, match="not found"):
            await publisher.publish(OutboxMessage(onceonly.uuid7(), "anything", "{}"))


async def test_unreachable_broker_raises_publish_error() -> None:
    """A connection that cannot be made raises PublishError, not a driver error."""
    publisher = RabbitMQPublisher("amqp://guest:guest@127.0.0.1:1/")
    with pytest.raises(onceonly.PublishError, match="connection"):
        await publisher.publish(OutboxMessage(onceonly.uuid7(), "q", "{}"))
    await publisher.close()
    with pytest.raises(onceonly.PublishError, match="closed"):
        await publisher.publish(OutboxMessage(onceonly.uuid7(), "q", "{}"))


async def test_publisher_reconnects_after_connection_loss(broker: Broker) -> None:
    """After its connection is lost, the next publish opens a new one."""
    queue = broker.name()
    await broker.declare(queue)
    async with RabbitMQPublisher(AMQP_URL) as publisher:
        await publisher.publish(OutboxMessage(onceonly.uuid7(), queue, "1"))
        first = publisher._connection
        assert first is not None
        await first.close()
        await publisher.publish(OutboxMessage(onceonly.uuid7(), queue, "2"))
        assert publisher._connection is not first
    assert [m.body for m in await broker.take(queue)] == [b"1", b"2"]


async def test_concurrent_publishes_pipeline_on_a_given_connection(broker: Broker) -> None:
    """500 concurrent publishes on a caller's connection are all confirmed and delivered."""
    queue = broker.name()
    await broker.declare(queue)
    publisher = RabbitMQPublisher(connection=broker.connection)
    ids = [onceonly.uuid7() for _ in range(500)]
    await asyncio.gather(*(publisher.publish(OutboxMessage(i, queue, "{}")) for i in ids))
    await publisher.close()
    assert not broker.connection.is_closed  # not the publisher's to close
    assert sorted(m.message_id for m in await broker.take(queue)) == sorted(ids)


@pytest.mark.parametrize(
    ("exc", "match"),
    [
        (
            aiormq.exceptions.PublishError(
                SimpleNamespace(delivery=Basic.Return(312, "NO_ROUTE", "", "q")), None
            ),
            "unroutable",
        ),
        (aiormq.exceptions.DeliveryError(None, Basic.Nack(1)), "refused"),
        (aiormq.exceptions.ChannelNotFoundEntity("no exchange"), "not found"),
        (asyncio.TimeoutError(), "in time"),
        (TimeoutError(), "in time"),
        (aiormq.exceptions.ConnectionClosed(320, "shutdown"), "connection"),
        (aiormq.exceptions.ChannelInvalidStateError("closed"), "connection"),
        (ConnectionRefusedError(), "connection"),
        (OSError("unreachable"), "connection"),
    ],
)
def test_every_driver_error_becomes_publish_error(exc: BaseException, match: str) -> None:
    """Each aio-pika/aiormq failure is translated into PublishError with its cause kept."""
    with pytest.raises(onceonly.PublishError, match=match) as info, _translate("m-1", "here"):
        raise exc
    assert info.value.__cause__ is exc
    assert info.value.key == "m-1"


# --- consumer ----------------------------------------------------------------------------


def consumer(db: Db, handler: Any, queue: str, **options: Any) -> RabbitMQConsumer:
    inbox = options.pop("inbox", None) or db.inbox()
    if "connection" not in options:
        options.setdefault("url", AMQP_URL)
    return RabbitMQConsumer(inbox, handler, queue=queue, shutdown_timeout=5.0, **options)


async def test_processes_once_and_acks_only_after_commit(
    broker: Broker, db: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each id runs once; its ledger row is committed before the ack; a duplicate is acked."""
    queue = broker.name()
    calls: list[str] = []
    at_ack: list[list[str]] = []
    original_ack = aio_pika.IncomingMessage.ack

    async def ack(self: aio_pika.IncomingMessage, multiple: bool = False) -> None:
        at_ack.append(db.ledger())  # what another connection sees when we ack
        await original_ack(self, multiple)

    monkeypatch.setattr(aio_pika.IncomingMessage, "ack", ack)

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> Any:
        calls.append(tx.key)
        assert tx.delivery is not None and tx.delivery.raw.processed is False
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (tx.key,))
        return {"ok": payload["n"]}

    async with consumer(db, handler, queue):
        await broker.publish(queue, {"n": 1}, message_id="m-1")
        await until(lambda: len(at_ack) == 1)
        await broker.publish(queue, {"n": 1}, message_id="m-1")  # the duplicate
        await broker.publish(queue, {"n": 2}, message_id="m-2")
        await until(lambda: len(at_ack) == 3)
    assert calls == ["m-1", "m-2"]
    assert db.ledger() == ["m-1", "m-2"]
    assert at_ack[0] == ["m-1"]
    assert await broker.count(queue) == 0
    assert await broker.count(f"{queue}.dead") == 0


async def test_poison_message_is_dead_lettered_with_headers(broker: Broker, db: Db) -> None:
    """A handler that always fails: after max_attempts the message goes to .dead, acked."""
    queue = broker.name()
    calls: list[int | None] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> Any:
        calls.append(tx.delivery.delivery_count if tx.delivery else None)
        raise ValueError("bad amount")

    inbox = db.inbox(max_attempts=2)
    async with consumer(db, handler, queue, inbox=inbox, connection=broker.connection):
        await broker.publish(queue, {"n": 1}, message_id="m-1", origin="test")
        await until_count(broker, f"{queue}.dead", 1)
    [dead] = await broker.take(f"{queue}.dead")
    assert dead.body == b'{"n": 1}'
    assert dead.message_id == "m-1"
    assert dead.headers["onceonly-dead-reason"] == "dead-lettered"
    assert "bad amount" in dead.headers["onceonly-error"]
    assert dead.headers["onceonly-attempts"] == "2"
    assert dead.headers["onceonly-message-id"] == "m-1"
    assert dead.headers["origin"] == "test"
    assert calls == [1, 2]
    assert await broker.count(queue) == 0  # acked, not coming back
    assert not broker.connection.is_closed  # the caller's connection stays open


async def test_classic_queue_mismatch_when_dead_letter_fails_is_not_acked(
    broker: Broker, db: Db, caplog: pytest.LogCaptureFixture
) -> None:
    """Classic queue, no count: a mismatch whose dead-letter publish fails stays queued."""
    queue = broker.name()
    await broker.declare(queue, quorum=False)
    deliveries: list[Any] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> Any:
        deliveries.append(tx.delivery)

    caplog.set_level("ERROR", logger="onceonly.brokers.rabbitmq")
    # declare=False: the dead-letter queue does not exist, so its publish is unroutable
    async with consumer(db, handler, queue, declare=False, queue_type="classic"):
        await broker.publish(queue, {"n": 1}, message_id="m-1")
        await until(lambda: len(deliveries) == 1)
        await broker.publish(queue, {"n": 2}, message_id="m-1")  # same id, other payload
        await until(lambda: "dead-letter publish failed" in caplog.text)
    assert [d.delivery_count for d in deliveries] == [None]
    assert deliveries[0].redelivered is False
    assert "m-1" in caplog.text
    await until_count(broker, queue, 1)  # not dropped: back in the queue
    [kept] = await broker.take(queue)
    assert kept.body == b'{"n": 2}'


async def test_long_handler_keeps_its_message_thanks_to_heartbeats(
    broker: Broker, db: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler awaiting 3.5 s on heartbeat=1 keeps its connection: acked once, no redelivery."""
    queue = broker.name()
    calls: list[int | None] = []
    acked: list[bool] = []
    original_ack = aio_pika.IncomingMessage.ack

    async def ack(self: aio_pika.IncomingMessage, multiple: bool = False) -> None:
        await original_ack(self, multiple)
        acked.append(bool(self.redelivered))

    monkeypatch.setattr(aio_pika.IncomingMessage, "ack", ack)

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> Any:
        calls.append(tx.delivery.delivery_count if tx.delivery else None)
        await asyncio.sleep(3.5)
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (tx.key,))

    url = f"{AMQP_URL}?heartbeat=1"
    async with consumer(db, handler, queue, url=url) as c:
        connection = c._connection
        assert connection is not None
        underlay = connection.transport.connection if connection.transport else None
        await broker.publish(queue, {"n": 1}, message_id="m-1")
        await until(lambda: bool(acked), timeout=15)
        assert await broker.count(queue) == 0  # held, never handed back meanwhile
        assert connection.transport is not None
        assert connection.transport.connection is underlay  # never reconnected
    assert calls == [1]
    assert acked == [False]
    assert db.ledger() == ["m-1"]


async def test_graceful_stop_finishes_the_running_handler(broker: Broker, db: Db) -> None:
    """stop() takes no new message, lets the running handler commit, acks it, then closes."""
    queue = broker.name()
    started = asyncio.Event()
    calls: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> Any:
        calls.append(tx.key)
        started.set()
        await asyncio.sleep(1.0)
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (tx.key,))

    c = consumer(db, handler, queue, concurrency=1)
    task = asyncio.ensure_future(c.run())
    await until_count(broker, queue, 0)  # the queue exists once run() declared it
    await broker.publish(queue, {"n": 1}, message_id="m-1")
    await asyncio.wait_for(started.wait(), 10)
    await broker.publish(queue, {"n": 2}, message_id="m-2")
    await c.stop()
    await asyncio.wait_for(task, 1)
    assert calls == ["m-1"]
    assert db.ledger() == ["m-1"]
    assert [m.message_id for m in await broker.take(queue)] == ["m-2"]  # m-1 acked


async def test_stop_past_shutdown_timeout_rolls_back_and_requeues(broker: Broker, db: Db) -> None:
    """A handler still running at shutdown_timeout is cancelled: no row, the message returns."""
    queue = broker.name()
    started = asyncio.Event()

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> Any:
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (tx.key,))
        started.set()
        await asyncio.sleep(60)

    async with consumer(db, handler, queue) as c:
        c.shutdown_timeout = 0.3
        await broker.publish(queue, {"n": 1}, message_id="m-1")
        await asyncio.wait_for(started.wait(), 10)
    assert db.ledger() == []
    await until_count(broker, queue, 1)  # requeued when the consumer's channel closed


async def test_run_raises_when_a_given_connection_is_lost(broker: Broker, db: Db) -> None:
    """run() on a caller's plain connection fails loudly when that connection dies."""
    queue = broker.name()

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> Any:
        return None

    connection = await aio_pika.connect(AMQP_URL)
    c = consumer(db, handler, queue, connection=connection)
    task = asyncio.ensure_future(c.run())
    deadline = asyncio.get_running_loop().time() + 10
    while await broker.consumers(queue) != 1:  # consuming, not still opening (that raises
        assert asyncio.get_running_loop().time() < deadline  # ConnectionClosed instead)
        await asyncio.sleep(0.05)
    await connection.close()
    with pytest.raises(aiormq.exceptions.ChannelInvalidStateError, match="closed"):
        await asyncio.wait_for(task, 5)


def test_needs_exactly_one_of_url_and_connection(db: Db) -> None:
    """A consumer or publisher with both or neither of url= and connection= is refused."""

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> Any:
        return None

    with pytest.raises(onceonly.ConfigurationError):
        RabbitMQConsumer(db.inbox(), handler, queue="q")
    with pytest.raises(onceonly.ConfigurationError):
        RabbitMQPublisher()


async def test_publisher_recovers_after_a_network_loss(broker: Broker) -> None:
    """After the network drops the connection (not close()), publishing resumes."""
    from tests.e2e._proxy import TcpProxy

    queue = broker.name()
    await broker.declare(queue)
    proxy = TcpProxy("127.0.0.1", int(AMQP_URL.rsplit(":", 1)[1].strip("/"))).start()
    url = f"amqp://guest:guest@127.0.0.1:{proxy.port}/"
    async with RabbitMQPublisher(url, timeout=3) as publisher:
        await publisher.publish(OutboxMessage(onceonly.uuid7(), queue, "1"))
        assert proxy.drop() >= 1
        delivered = False
        for _ in range(5):  # the first publish may see the dead channel; then it reconnects
            try:
                await publisher.publish(OutboxMessage(onceonly.uuid7(), queue, "2"))
            except onceonly.PublishError:
                await asyncio.sleep(0.2)
                continue
            delivered = True
            break
    assert delivered
    assert [m.body for m in await broker.take(queue)] == [b"1", b"2"]


# --- settlement: every delivery ends acked, retried with backoff, or dead-lettered -------


def spy_acks(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    acked: list[str | None] = []
    original_ack = aio_pika.IncomingMessage.ack

    async def ack(self: aio_pika.IncomingMessage, multiple: bool = False) -> None:
        await original_ack(self, multiple)
        acked.append(self.message_id)

    monkeypatch.setattr(aio_pika.IncomingMessage, "ack", ack)
    return acked


@pytest.mark.parametrize(
    "transient",
    [
        lambda: onceonly.StoreUnavailable("connection lost"),
        lambda: onceonly.InFlight("held elsewhere", retry_after=0.01),
    ],
    ids=["store-unavailable", "in-flight"],
)
async def test_transient_errors_are_retried_without_counting(
    broker: Broker, db: Db, transient: Callable[[], Exception]
) -> None:
    """Four StoreUnavailable/InFlight: retried with backoff, no redelivery, no attempt used."""
    queue = broker.name()
    seen: list[tuple[int | None, int]] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> Any:
        seen.append((tx.delivery.delivery_count if tx.delivery else None, tx.attempt))
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (tx.key,))

    inbox = db.inbox()
    real = inbox.process
    failures = [transient() for _ in range(4)]

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return await real(*args, **kwargs)

    inbox.process = flaky  # type: ignore[method-assign]
    async with consumer(db, handler, queue, inbox=inbox, retry_delay=0.05, max_deliveries=2):
        await broker.publish(queue, {"n": 1}, message_id="m-1")
        await until(lambda: db.ledger() == ["m-1"])
        await until_count(broker, queue, 0)
    assert seen == [(1, 1)]  # delivered once: the broker's count never moved
    assert await broker.count(f"{queue}.dead") == 0


async def test_store_lost_under_the_handler_is_retried_without_counting(
    broker: Broker, db: Db
) -> None:
    """The handler's own store access fails transiently (as when its connection drops):
    the inbox raises StoreUnavailable and the consumer retries in place, uncounted."""
    queue = broker.name()
    seen: list[int | None] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> Any:
        seen.append(tx.delivery.delivery_count if tx.delivery else None)
        if len(seen) <= 3:
            raise onceonly.StoreUnavailable("connection lost")
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (tx.key,))

    async with consumer(db, handler, queue, retry_delay=0.05, max_deliveries=2):
        await broker.publish(queue, {"n": 1}, message_id="m-1")
        await until(lambda: db.ledger() == ["m-1"])
        await until_count(broker, queue, 0)
    assert seen == [1, 1, 1, 1]  # the broker's count never moved
    assert await broker.count(f"{queue}.dead") == 0


@pytest.mark.parametrize("case", ["too-large", "unencodable"])
async def test_result_too_large_or_unencodable_is_dead_lettered(
    broker: Broker, db: Db, case: str
) -> None:
    """TooLarge / EncodingError from the inbox: dead-lettered after one run, not retried."""
    queue = broker.name()
    calls: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> Any:
        calls.append(tx.key)
        return "x" * 100 if case == "too-large" else object()

    inbox = db.inbox(max_result_bytes=16)
    async with consumer(db, handler, queue, inbox=inbox):
        await broker.publish(queue, {"n": 1}, message_id="m-1")
        await until_count(broker, f"{queue}.dead", 1)
    [dead] = await broker.take(f"{queue}.dead")
    assert dead.headers["onceonly-dead-reason"] == case
    assert calls == ["m-1"]
    assert await broker.count(queue) == 0


async def test_worker_killed_by_its_handler_is_dead_lettered_after_max_deliveries(
    broker: Broker, db: Db
) -> None:
    """A handler that kills the worker (nothing commits): dead-lettered unrun on delivery 4."""
    from tests.brokers._crash_consumer import EXIT_IN_HANDLER, crash_loop, runs

    queue = broker.name()
    channel = await broker.chan()
    await channel.declare_queue(f"{queue}.dead", durable=True, arguments={"x-queue-type": "quorum"})
    await channel.declare_queue(
        queue,
        durable=True,
        arguments={
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": f"{queue}.dead",
        },
    )
    await broker.publish(queue, {"n": 1}, message_id="m-poison")
    config = {
        "broker": "rabbitmq",
        "url": AMQP_URL,
        "queue": queue,
        "db": str(db.path),
        "runs": str(db.path.parent / "runs"),
        "max_deliveries": 3,
    }
    exits = await crash_loop(config, lambda: broker.count(f"{queue}.dead"))
    assert exits == [EXIT_IN_HANDLER] * 3
    assert runs(db.path.parent / "runs") == [1, 2, 3]
    [dead] = await broker.take(f"{queue}.dead")
    assert dead.headers["onceonly-dead-reason"] == "max-deliveries"
    assert dead.headers["onceonly-message-id"] == "m-poison"
    # the poison's own count (3) is not copied: a redrive starts counting afresh
    assert dead.headers.get("x-delivery-count") in (None, 0)
    assert db.ledger() == []
    assert await broker.count(queue) == 0


async def test_stop_during_a_store_outage_hands_the_message_back_at_once(
    broker: Broker, db: Db
) -> None:
    """A message retried in place while the store is down is requeued as soon as stop() runs."""
    queue = broker.name()
    tries: list[float] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> Any:
        raise AssertionError("never runs")

    inbox = db.inbox()

    async def down(*args: Any, **kwargs: Any) -> Any:
        tries.append(asyncio.get_running_loop().time())
        raise onceonly.StoreUnavailable("connection refused")

    inbox.process = down  # type: ignore[method-assign]
    c = consumer(db, handler, queue, inbox=inbox, retry_delay=0.05, max_backoff=30.0)
    c.shutdown_timeout = 30.0
    async with c:
        await broker.publish(queue, {"n": 1}, message_id="m-1")
        await until(lambda: len(tries) >= 3)
        stopping = asyncio.get_running_loop().time()
    assert asyncio.get_running_loop().time() - stopping < 5  # not shutdown_timeout
    await until_count(broker, queue, 1)  # handed back, not acked, not dead-lettered
    assert await broker.count(f"{queue}.dead") == 0


async def test_dedup_window_refuses_a_ttl_shorter_than_the_queue_message_ttl(
    broker: Broker, db: Db
) -> None:
    """The queue this consumer declares keeps messages an hour; the inbox remembers a
    minute: refused at start."""
    queue = broker.name()
    c = consumer(
        db, lambda p, tx: None, queue, inbox=db.inbox(ttl=60),
        queue_arguments={"x-message-ttl": 3_600_000}, dedup_window="refuse",
    )  # fmt: skip
    with pytest.raises(onceonly.ConfigurationError, match="x-message-ttl: 3600 s"):
        await asyncio.wait_for(c.run(), 10)


@pytest.mark.parametrize("key", ["content", "event_id", "broker-first"])
async def test_one_body_published_twice_by_aio_pika_runs_once(
    broker: Broker, db: Db, key: str
) -> None:
    """aio-pika gives every publish a random message_id: a consumer keyed by content or
    by a field runs one body published twice once (MessageIds(fallback=...), the
    broker's id first, runs it twice: the ids differ)."""
    from onceonly.brokers import MessageIds

    queue = broker.name()
    calls: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        calls.append(tx.key)
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (tx.key,))

    option: Any = MessageIds(fallback="event_id") if key == "broker-first" else key
    channel = await broker.chan()
    async with consumer(db, handler, queue, message_id=option):
        for _ in range(2):  # a plain aio-pika producer, no message_id given
            message = aio_pika.Message(onceonly_json({"event_id": "e-1", "amount": 5}))
            await channel.default_exchange.publish(message, routing_key=queue)
        await until(lambda: len(calls) >= (2 if key == "broker-first" else 1))
        await until_count(broker, queue, 0)
        await asyncio.sleep(0.3)
    assert len(calls) == (2 if key == "broker-first" else 1)
    assert len(set(calls)) == len(calls)
    assert sorted(db.ledger()) == sorted(calls)
    assert await broker.count(f"{queue}.dead") == 0


@pytest.mark.parametrize("content_type", ["text/json", "text/json; charset=utf-8"])
async def test_text_json_content_type_is_parsed_as_json(
    broker: Broker, db: Db, content_type: str
) -> None:
    """``text/json`` (an older name some producers still send) is JSON, as
    ``application/json`` is: the handler gets the parsed payload, not bytes."""
    queue = broker.name()
    got: list[Any] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        got.append(payload)

    async with consumer(db, handler, queue):
        channel = await broker.chan()
        await channel.default_exchange.publish(
            aio_pika.Message(b'{"n": 1}', message_id="m-1", content_type=content_type),
            routing_key=queue,
        )
        await until(lambda: len(got) == 1)
    assert got == [{"n": 1}]
