# SPDX-License-Identifier: MIT
"""One small driver per broker for the contract suite (test_contract.py): send a
message, make a consumer, read the dead letters, tell whether everything was settled.

Every kit uses a queue / stream / prefix of its own and deletes it at the end. The real
brokers run on this machine; a missing one fails in CI (tests/conftest.py unavailable).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import aiormq
import pamqp.header

import onceonly
from onceonly.brokers._loop import ConsumerLoop
from onceonly.testing import MemoryBroker, MemoryConsumer
from tests.conftest import unavailable

AMQP_URL = os.environ.get("ONCEONLY_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("ONCEONLY_TEST_NATS", "nats://127.0.0.1:4222")
REDIS_URL = os.environ.get("ONCEONLY_TEST_REDIS", "redis://127.0.0.1:6379/0")
#: Kafka here is Tansu 0.6.0 (a Kafka-compatible broker, not Apache Kafka): scripts/services
KAFKA_BOOTSTRAP = os.environ.get("ONCEONLY_TEST_KAFKA", "127.0.0.1:9092")
#: Group joins in seconds instead of ~23 s with the client's defaults (measured on Tansu).
KAFKA_FAST_JOIN: dict[str, Any] = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}

#: Fast settings every kit's consumer gets unless a test overrides them.
FAST: dict[str, Any] = {"retry_delay": 0.05, "max_backoff": 0.2, "shutdown_timeout": 5.0}


@contextlib.contextmanager
def without_message_id() -> Iterator[None]:
    """aiormq gives every publish a message_id; other clients do not: strip it on the wire."""
    frame_class = aiormq.channel.ChannelFrame
    original = frame_class.__dict__["marshall"]

    def marshall(cls: Any, channel_number: int, frames: Any, drain_future: Any = None) -> Any:
        frames = list(frames)
        for frame in frames:
            if isinstance(frame, pamqp.header.ContentHeader):
                frame.properties.message_id = None
        return original.__func__(cls, channel_number, frames, drain_future)

    frame_class.marshall = classmethod(marshall)
    try:
        yield
    finally:
        frame_class.marshall = original


def _text_headers(headers: Any) -> dict[str, str]:
    return {
        str(k): v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
        for k, v in dict(headers or {}).items()
    }


class Kit:
    """What the contract needs from a broker."""

    name = ""
    #: a message sent without an id still has one (SQS's MessageId)
    always_has_id = False
    #: consumer options so that what a stopped consumer held comes back soon
    takeover: ClassVar[dict[str, Any]] = {}
    #: the broker counts deliveries across consumers (Kafka does not: the inbox's
    #: pre-counted attempts count crashes there, tests/brokers/test_kafka.py)
    counts_deliveries = True

    async def start(self) -> None: ...

    async def cleanup(self) -> None: ...

    async def send(
        self, payload: Any = None, *, message_id: str | None = None, body: bytes | None = None
    ) -> None:
        raise NotImplementedError

    def consumer(self, inbox: onceonly.AsyncInbox, handler: Any, **kw: Any) -> ConsumerLoop:
        raise NotImplementedError

    async def dead(self) -> list[tuple[bytes, dict[str, str]]]:
        """The dead letters so far: (body, headers)."""
        raise NotImplementedError

    async def settled(self) -> bool:
        """Nothing left unacknowledged (checked after the consumer stopped)."""
        raise NotImplementedError


def _body(payload: Any, body: bytes | None) -> bytes:
    return body if body is not None else json.dumps(payload).encode()


class MemoryKit(Kit):
    name = "memory"

    async def start(self) -> None:
        self.broker = MemoryBroker()

    async def send(
        self, payload: Any = None, *, message_id: str | None = None, body: bytes | None = None
    ) -> None:
        self.broker.send("in", body=_body(payload, body), message_id=message_id)

    def consumer(self, inbox: onceonly.AsyncInbox, handler: Any, **kw: Any) -> ConsumerLoop:
        return MemoryConsumer(inbox, handler, broker=self.broker, queue="in", **{**FAST, **kw})

    async def dead(self) -> list[tuple[bytes, dict[str, str]]]:
        return [
            (d.body, _text_headers(d.headers)) for d in self.broker.dead_letters.get("in.dead", [])
        ]

    async def settled(self) -> bool:
        return self.broker.depth("in") == 0


class RabbitKit(Kit):
    name = "rabbitmq"

    async def start(self) -> None:
        import aio_pika

        try:
            self.conn = await asyncio.wait_for(aio_pika.connect(AMQP_URL), 5)
        except Exception:
            unavailable(f"RabbitMQ at {AMQP_URL}")
        self.channel = await self.conn.channel()
        self.queue = f"onceonly-contract-{uuid.uuid4().hex[:12]}"
        self._dead: list[tuple[bytes, dict[str, str]]] = []

    async def cleanup(self) -> None:
        for name in (self.queue, f"{self.queue}.dead"):
            with contextlib.suppress(Exception):
                await self.channel.queue_delete(name)
        await self.conn.close()

    async def send(
        self, payload: Any = None, *, message_id: str | None = None, body: bytes | None = None
    ) -> None:
        import aio_pika

        await self.channel.declare_queue(
            self.queue,
            durable=True,
            arguments={
                "x-queue-type": "quorum",
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": f"{self.queue}.dead",
            },
        )
        message = aio_pika.Message(_body(payload, body), message_id=message_id)
        strip = without_message_id() if message_id is None else contextlib.nullcontext()
        with strip:  # aiormq gives every publish a message_id; other clients do not
            await self.channel.default_exchange.publish(message, routing_key=self.queue)

    def consumer(self, inbox: onceonly.AsyncInbox, handler: Any, **kw: Any) -> ConsumerLoop:
        from onceonly.brokers.rabbitmq import RabbitMQConsumer

        return RabbitMQConsumer(inbox, handler, url=AMQP_URL, queue=self.queue, **{**FAST, **kw})

    async def dead(self) -> list[tuple[bytes, dict[str, str]]]:
        with contextlib.suppress(Exception):
            q = await self.channel.get_queue(f"{self.queue}.dead", ensure=True)
            while (m := await q.get(no_ack=True, fail=False)) is not None:
                self._dead.append((m.body, _text_headers(m.headers)))
        return list(self._dead)

    async def settled(self) -> bool:
        q = await self.channel.declare_queue(self.queue, passive=True)
        return q.declaration_result.message_count == 0


class NatsKit(Kit):
    name = "nats"

    async def start(self) -> None:
        import nats

        try:
            self.nc = await asyncio.wait_for(nats.connect(NATS_URL), 5)
        except Exception:
            unavailable(f"NATS at {NATS_URL}")
        self.js = self.nc.jetstream()
        tag = uuid.uuid4().hex[:12]
        self.stream = f"CONTRACT_{tag}"
        self.subject = f"contract.{tag}.in"
        await self.js.add_stream(name=self.stream, subjects=[self.subject])

    async def cleanup(self) -> None:
        for name in (self.stream, f"{self.stream}_dead"):
            with contextlib.suppress(Exception):
                await self.js.delete_stream(name)
        await self.nc.close()

    async def send(
        self, payload: Any = None, *, message_id: str | None = None, body: bytes | None = None
    ) -> None:
        headers = {"Nats-Msg-Id": message_id} if message_id else None
        await self.js.publish(self.subject, _body(payload, body), headers=headers)

    def consumer(self, inbox: onceonly.AsyncInbox, handler: Any, **kw: Any) -> ConsumerLoop:
        from onceonly.brokers.nats import NatsConsumer

        kw.setdefault("poll_timeout", 0.25)
        return NatsConsumer(
            inbox,
            handler,
            url=NATS_URL,
            stream=self.stream,
            subject=self.subject,
            durable="contract",
            **{**FAST, **kw},
        )

    async def dead(self) -> list[tuple[bytes, dict[str, str]]]:
        out: list[tuple[bytes, dict[str, str]]] = []
        try:
            info = await self.js.stream_info(f"{self.stream}_dead")
        except Exception:
            return out
        if not info.state.messages:
            return out
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await self.js.get_msg(f"{self.stream}_dead", seq)
            out.append((msg.data or b"", _text_headers(msg.headers)))
        return out

    async def settled(self) -> bool:
        info = await self.js.consumer_info(self.stream, "contract")
        return info.num_pending == 0 and info.num_ack_pending == 0


class RedisKit(Kit):
    name = "redis"
    takeover: ClassVar[dict[str, Any]] = {"claim_idle": 0.2}

    async def start(self) -> None:
        import redis.asyncio

        self.r = redis.asyncio.Redis.from_url(REDIS_URL)
        try:
            await asyncio.wait_for(self.r.ping(), 3)
        except Exception:
            await self.r.aclose()
            unavailable(f"Redis at {REDIS_URL}")
        self.prefix = f"onceonly-contract:{uuid.uuid4().hex[:12]}:"
        self.stream = f"{self.prefix}in"

    async def cleanup(self) -> None:
        keys = [k async for k in self.r.scan_iter(match=f"{self.prefix}*")]
        if keys:
            await self.r.delete(*keys)
        await self.r.aclose()

    async def send(
        self, payload: Any = None, *, message_id: str | None = None, body: bytes | None = None
    ) -> None:
        fields: dict[Any, Any] = {"payload": _body(payload, body), "headers": "{}"}
        if message_id:
            fields["id"] = message_id
        await self.r.xadd(self.stream, fields)

    def consumer(self, inbox: onceonly.AsyncInbox, handler: Any, **kw: Any) -> ConsumerLoop:
        from onceonly.brokers.redis_streams import RedisStreamsConsumer

        kw.setdefault("block_ms", 50)
        return RedisStreamsConsumer(
            inbox,
            handler,
            url=REDIS_URL,
            stream=self.stream,
            group="g",
            consumer_name="c1",
            **{**FAST, **kw},
        )

    async def dead(self) -> list[tuple[bytes, dict[str, str]]]:
        entries = await self.r.xrange(f"{self.stream}.dead")
        return [(f[b"payload"], json.loads(f[b"headers"])) for _, f in entries]

    async def settled(self) -> bool:
        groups = await self.r.xinfo_groups(self.stream)
        return all(g["pending"] == 0 for g in groups) and bool(groups)


_MOTO: dict[str, Any] = {}


def moto_endpoint() -> str:
    """A moto_server (a real HTTP process speaking the SQS API: no SQS runs on these
    machines) on a free port, started once for the test run and ended at exit."""
    if "url" in _MOTO:
        return str(_MOTO["url"])
    import atexit
    import shutil
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable))
    if exe is None:
        unavailable("moto_server (pip install 'moto[server]')")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [str(exe), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    atexit.register(proc.terminate)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                unavailable(f"moto_server on port {port}")
            time.sleep(0.1)
    _MOTO["url"] = url
    return url


SQS_OPTIONS = {
    "region_name": "us-east-1",
    "aws_access_key_id": "test",
    "aws_secret_access_key": "test",
}


class SqsKit(Kit):
    """SQS: always has an id (its MessageId when no attribute and no fallback)."""

    name = "sqs"
    always_has_id = True

    async def start(self) -> None:
        from aiobotocore.session import get_session

        self.options = {**SQS_OPTIONS, "endpoint_url": moto_endpoint()}
        self.session = get_session()
        self.stack = contextlib.AsyncExitStack()
        self.client = await self.stack.enter_async_context(
            self.session.create_client("sqs", **self.options)
        )
        self.queue = f"contract-{uuid.uuid4().hex[:12]}"
        self.url = (await self.client.create_queue(QueueName=self.queue))["QueueUrl"]
        self._dead: list[tuple[bytes, dict[str, str]]] = []

    async def cleanup(self) -> None:
        for name in (self.queue, f"{self.queue}-dead"):
            with contextlib.suppress(Exception):
                url = (await self.client.get_queue_url(QueueName=name))["QueueUrl"]
                await self.client.delete_queue(QueueUrl=url)
        await self.stack.aclose()

    async def send(
        self, payload: Any = None, *, message_id: str | None = None, body: bytes | None = None
    ) -> None:
        attributes = (
            {"onceonly-message-id": {"DataType": "String", "StringValue": message_id}}
            if message_id
            else {}
        )
        await self.client.send_message(
            QueueUrl=self.url,
            MessageBody=_body(payload, body).decode(),
            MessageAttributes=attributes,
        )

    def consumer(self, inbox: onceonly.AsyncInbox, handler: Any, **kw: Any) -> ConsumerLoop:
        from onceonly.brokers.sqs import SqsConsumer

        options = {**FAST, **kw, **self.options}
        return SqsConsumer(inbox, handler, queue=self.queue, session=self.session, **options)

    async def dead(self) -> list[tuple[bytes, dict[str, str]]]:
        with contextlib.suppress(Exception):
            url = (await self.client.get_queue_url(QueueName=f"{self.queue}-dead"))["QueueUrl"]
            while True:
                reply = await self.client.receive_message(
                    QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
                )
                if not reply.get("Messages"):
                    break
                for m in reply["Messages"]:
                    attrs = m.get("MessageAttributes", {})
                    headers = {k: v["StringValue"] for k, v in attrs.items()}
                    self._dead.append((m["Body"].encode(), headers))
                    handle = m["ReceiptHandle"]
                    await self.client.delete_message(QueueUrl=url, ReceiptHandle=handle)
        return list(self._dead)

    async def settled(self) -> bool:
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        reply = await self.client.get_queue_attributes(QueueUrl=self.url, AttributeNames=names)
        return all(int(reply["Attributes"][n]) == 0 for n in names)


def kafka_read_all(topic: str, idle: float = 0.3) -> list[Any]:
    """Every record of ``topic``, read without a group (no join). Read to the end, not
    to the high watermark: Tansu 0.6.0 reports a wrong one (``ListOffsets`` latest
    counts record batches, not records: measured 1 for 11 records in 2 batches)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": KAFKA_BOOTSTRAP, "group.id": "onceonly-reader"})
    try:
        meta = c.list_topics(topic, timeout=5).topics.get(topic)
        if meta is None or meta.error is not None:
            return []
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(meta.partitions)])
        out: list[Any] = []
        while (m := c.poll(idle)) is not None:
            if m.error() is None:
                out.append(m)
        return out
    finally:
        c.close()


def kafka_committed(group: str, topic: str) -> list[tuple[int, int]]:
    """(committed offset, end: the last record's offset + 1, 0 when empty) per
    partition of ``topic`` for ``group``."""
    from confluent_kafka import Consumer, TopicPartition

    ends: dict[int, int] = {}
    for m in kafka_read_all(topic):
        ends[m.partition()] = max(ends.get(m.partition(), 0), m.offset() + 1)
    c = Consumer({"bootstrap.servers": KAFKA_BOOTSTRAP, "group.id": group})
    try:
        meta = c.list_topics(topic, timeout=5).topics[topic]
        tps = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
        committed = c.committed(tps, timeout=5)
        return [(max(tp.offset, 0), ends.get(tp.partition, 0)) for tp in committed]
    finally:
        c.close()


class KafkaKit(Kit):
    """Kafka on Tansu: a record without a header still has an id (topic/partition/offset);
    Kafka keeps no delivery count across consumers."""

    name = "kafka"
    always_has_id = True
    counts_deliveries = False

    async def start(self) -> None:
        from onceonly.brokers.kafka._wire import ensure_topics

        tag = uuid.uuid4().hex[:12]
        self.topic = f"contract-{tag}"
        self.group = f"contract-{tag}"
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(
                None, ensure_topics, {"bootstrap.servers": KAFKA_BOOTSTRAP}, [(self.topic, 1)], 5.0
            )
        except Exception:
            unavailable(f"Kafka (Tansu) at {KAFKA_BOOTSTRAP}")
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": KAFKA_BOOTSTRAP, "linger.ms": 0})

    async def send(
        self, payload: Any = None, *, message_id: str | None = None, body: bytes | None = None
    ) -> None:
        headers = [("onceonly-message-id", message_id.encode())] if message_id else None
        self.producer.produce(self.topic, value=_body(payload, body), headers=headers)
        await asyncio.get_running_loop().run_in_executor(None, self.producer.flush, 10)

    def consumer(self, inbox: onceonly.AsyncInbox, handler: Any, **kw: Any) -> ConsumerLoop:
        from onceonly.brokers.kafka import KafkaConsumer

        return KafkaConsumer(
            inbox,
            handler,
            topics=[self.topic],
            group=self.group,
            bootstrap=KAFKA_BOOTSTRAP,
            config=KAFKA_FAST_JOIN,
            **{**FAST, **kw},
        )

    async def dead(self) -> list[tuple[bytes, dict[str, str]]]:
        loop = asyncio.get_running_loop()
        records = await loop.run_in_executor(None, kafka_read_all, f"{self.topic}.dead")
        return [(m.value() or b"", _text_headers(m.headers() or [])) for m in records]

    async def settled(self) -> bool:
        loop = asyncio.get_running_loop()
        marks = await loop.run_in_executor(None, kafka_committed, self.group, self.topic)
        return all(committed == high for committed, high in marks)


KITS: dict[str, type[Kit]] = {
    k.name: k for k in (MemoryKit, RabbitKit, NatsKit, RedisKit, SqsKit, KafkaKit)
}
