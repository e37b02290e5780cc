# SPDX-License-Identifier: MIT
"""What the end-to-end test and its helper processes share.

One pipeline is named by a prefix ``e2e_<hex>``: service A's ``<prefix>_events`` and
the outbox ``<prefix>_outbox``; service B's inbox records ``<prefix>_records`` and its
ledger ``<prefix>_ledger``; on the broker the topic ``<prefix>`` (a RabbitMQ queue on
the default exchange, a NATS subject captured by the stream ``<PREFIX>``, a Redis stream
key, an SQS queue) and its dead-letter destination ``<prefix>.dead`` (SQS:
``<prefix>-dead``). SQS is moto_server, a real HTTP process the test starts: no SQS runs
on these machines.

This module imports no test framework: ``_relay.py`` and ``_consumer.py`` run it in
their own processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

PG_URL = os.environ.get("ONCEONLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
BROKER_URLS = {
    "rabbitmq": os.environ.get("ONCEONLY_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/"),
    "nats": os.environ.get("ONCEONLY_TEST_NATS", "nats://127.0.0.1:4222"),
    "redis": os.environ.get("ONCEONLY_TEST_REDIS", "redis://127.0.0.1:6379/0"),
    # moto_server (a real HTTP process speaking the SQS API: no SQS runs on these
    # machines); the test starts one when this is empty (tests/brokers/_kits.py)
    "sqs": os.environ.get("ONCEONLY_TEST_SQS", ""),
    # Tansu 0.6.0, a Kafka-compatible broker (not Apache Kafka): scripts/services kafka
    "kafka": "kafka://" + os.environ.get("ONCEONLY_TEST_KAFKA", "127.0.0.1:9092"),
}
#: the client settings of the Kafka consumers: group joins in seconds on Tansu
KAFKA_FAST_JOIN = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}
KAFKA_PARTITIONS = 2
#: what the SQS clients of every process pass besides the endpoint (moto takes any)
SQS_OPTIONS = {"region_name": "us-east-1", "aws_access_key_id": "t", "aws_secret_access_key": "t"}
BROKERS = tuple(BROKER_URLS)

CONSUMER = "ledger"  # the inbox scope, the Redis group and the NATS durable
#: JetStream drops a re-publish with the same Nats-Msg-Id inside the stream's duplicate
#: window (2 minutes by default). The e2e streams keep it short so that a relay's
#: republish reaches the consumer and the inbox is what deduplicates it.
NATS_DUPLICATE_WINDOW = 0.1  # the least JetStream accepts
#: Redeliveries come fast: NATS ack_wait and the Redis takeover idle time, in seconds.
REDELIVER_AFTER = 2.0
CONCURRENCY = 8


@dataclass(frozen=True)
class Names:
    """Every name of one pipeline."""

    prefix: str

    @property
    def events(self) -> str:
        return f"{self.prefix}_events"

    @property
    def outbox(self) -> str:
        return f"{self.prefix}_outbox"

    @property
    def records(self) -> str:
        return f"{self.prefix}_records"

    @property
    def ledger(self) -> str:
        return f"{self.prefix}_ledger"

    @property
    def topic(self) -> str:
        return self.prefix

    @property
    def dead(self) -> str:
        return f"{self.prefix}.dead"

    @property
    def sqs_dead(self) -> str:
        return f"{self.prefix}-dead"  # SQS queue names have no dots

    @property
    def nats_stream(self) -> str:
        return self.prefix.upper()

    @property
    def kafka_positions(self) -> str:
        return f"{self.prefix}_pos"  # the Kafka consumer's positions table


def die() -> None:
    """Die like a power cut: no cleanup, no rollback, no ack, no exit handlers."""
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(10)  # never reached


def write_json(path: str, data: Any) -> None:
    """Replace ``path`` with ``data`` atomically (readers never see half a file)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def read_json(path: str) -> dict[str, Any]:
    """What ``write_json`` wrote last; ``{}`` before the first write."""
    try:
        with open(path, encoding="utf-8") as f:
            data: dict[str, Any] = json.load(f)
            return data
    except FileNotFoundError:
        return {}


def via(url: str, port: int) -> str:
    """``url`` with its host and port replaced by ``127.0.0.1:port`` (a proxy)."""
    parts = urllib.parse.urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@127.0.0.1:{port}" if auth else f"127.0.0.1:{port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    default = {"amqp": 5672, "nats": 4222, "redis": 6379, "http": 80, "kafka": 9092}[parts.scheme]
    return parts.hostname or "127.0.0.1", parts.port or default


# -- publishers and consumers -----------------------------------------------------------


def make_publisher(broker: str, url: str) -> Any:
    """The broker's outbox publisher; the topic is the queue, subject or stream key."""
    if broker == "rabbitmq":
        from onceonly.brokers.rabbitmq import RabbitMQPublisher

        return RabbitMQPublisher(url, timeout=5.0)
    if broker == "nats":
        from onceonly.brokers.nats import NatsPublisher

        return NatsPublisher(url, timeout=5.0, connect_options={"reconnect_time_wait": 0.5})
    if broker == "redis":
        from onceonly.brokers.redis_streams import RedisStreamsPublisher

        return RedisStreamsPublisher(url, timeout=5.0)
    if broker == "sqs":
        from onceonly.brokers.sqs import SqsPublisher

        return SqsPublisher(timeout=5.0, endpoint_url=url, **SQS_OPTIONS)
    if broker == "kafka":
        from onceonly.brokers.kafka import KafkaPublisher

        return KafkaPublisher(url, timeout=5.0)
    raise ValueError(broker)


def make_consumer(
    broker: str, inbox: Any, handler: Any, url: str, names: Names, member: str
) -> Any:
    """The broker's inbox consumer, tuned so that redeliveries come within seconds."""
    if broker == "rabbitmq":
        from onceonly.brokers.rabbitmq import RabbitMQConsumer

        sep = "&" if "?" in url else "?"
        return RabbitMQConsumer(
            inbox,
            handler,
            queue=names.topic,
            url=f"{url}{sep}reconnect_interval=0.5",
            concurrency=CONCURRENCY,
            shutdown_timeout=10.0,
        )
    if broker == "nats":
        from onceonly.brokers.nats import NatsConsumer

        return NatsConsumer(
            inbox,
            handler,
            stream=names.nats_stream,
            subject=names.topic,
            durable=CONSUMER,
            url=url,
            ack_wait=REDELIVER_AFTER,
            batch=CONCURRENCY,
            max_backoff=1.0,
            poll_timeout=0.5,
            shutdown_timeout=10.0,
            connect_options={"reconnect_time_wait": 0.5},
        )
    if broker == "redis":
        from onceonly.brokers.redis_streams import RedisStreamsConsumer

        return RedisStreamsConsumer(
            inbox,
            handler,
            stream=names.topic,
            group=CONSUMER,
            url=url,
            consumer_name=member,
            block_ms=500,
            count=CONCURRENCY,
            concurrency=CONCURRENCY,
            claim_idle=REDELIVER_AFTER,
            retry_delay=0.2,
            shutdown_timeout=10.0,
        )
    if broker == "sqs":
        from onceonly.brokers.sqs import SqsConsumer

        return SqsConsumer(
            inbox,
            handler,
            queue=names.topic,
            dead_letter=names.sqs_dead,
            visibility_timeout=int(REDELIVER_AFTER),
            wait_time=1,
            concurrency=CONCURRENCY,
            retry_delay=0.2,
            max_backoff=1.0,
            shutdown_timeout=10.0,
            endpoint_url=url,
            **SQS_OPTIONS,
        )
    if broker == "kafka":
        from onceonly.brokers.kafka import KafkaConsumer
        from onceonly.brokers.kafka._publisher import bootstrap_of

        return KafkaConsumer(
            inbox,
            handler,
            topics=[names.topic],
            group=names.prefix,  # one group per pipeline (its positions rows too)
            bootstrap=bootstrap_of(url),
            config=KAFKA_FAST_JOIN,
            positions_table=names.kafka_positions,
            partitions=KAFKA_PARTITIONS,
            concurrency=CONCURRENCY,
            retry_delay=0.2,
            max_backoff=1.0,
            shutdown_timeout=10.0,
        )
    raise ValueError(broker)


def patch_acks(broker: str, on_ack: Any) -> None:
    """Call ``on_ack(n)`` before the broker client sends each acknowledgement of
    ``n`` messages (the consumer acks only after the inbox committed)."""
    if broker == "rabbitmq":
        import aio_pika.message

        cls: Any = aio_pika.message.IncomingMessage
        original = cls.ack

        async def ack(self: Any, multiple: bool = False) -> None:
            on_ack(1)
            await original(self, multiple)

        cls.ack = ack
    elif broker == "nats":
        import nats.aio.msg

        msg_cls: Any = nats.aio.msg.Msg
        original_ack = msg_cls.ack

        async def msg_ack(self: Any) -> None:
            on_ack(1)
            await original_ack(self)

        msg_cls.ack = msg_ack
    elif broker == "redis":
        import redis.asyncio

        redis_cls: Any = redis.asyncio.Redis
        original_xack = redis_cls.xack

        async def xack(self: Any, name: Any, groupname: Any, *ids: Any) -> Any:
            on_ack(len(ids))
            return await original_xack(self, name, groupname, *ids)

        redis_cls.xack = xack
    elif broker == "sqs":
        from onceonly.brokers.sqs._transport import SqsTransport

        transport_cls: Any = SqsTransport
        original_delete = transport_cls.ack

        async def delete(self: Any, d: Any) -> None:  # DeleteMessage
            on_ack(1)
            await original_delete(self, d)

        transport_cls.ack = delete
    elif broker == "kafka":
        from onceonly.brokers.kafka._transport import KafkaTransport

        kafka_cls: Any = KafkaTransport
        original_settle = kafka_cls.ack

        async def settle(self: Any, d: Any) -> None:  # the record settled: offsets may move
            on_ack(1)
            await original_settle(self, d)

        kafka_cls.ack = settle
    else:
        raise ValueError(broker)


# -- the broker's side of one pipeline --------------------------------------------------


async def reachable(broker: str, url: str) -> bool:
    """Whether the broker answers (JetStream enabled, for NATS)."""
    try:
        if broker == "rabbitmq":
            import aio_pika

            conn = await asyncio.wait_for(aio_pika.connect(url), 5)
            await conn.close()
        elif broker == "nats":
            import nats

            nc = await asyncio.wait_for(
                nats.connect(url, connect_timeout=2, max_reconnect_attempts=0), 5
            )
            try:
                await nc.jetstream().account_info()
            finally:
                await nc.close()
        elif broker == "sqs":
            async with _sqs(url) as client:
                await asyncio.wait_for(client.list_queues(), 5)
        elif broker == "kafka":
            from onceonly.brokers.kafka._wire import partitions_of

            config = _kafka_config(url)
            await asyncio.get_running_loop().run_in_executor(None, partitions_of, config, [], 5.0)
        else:
            import redis.asyncio

            client = redis.asyncio.Redis.from_url(url)
            try:
                await asyncio.wait_for(client.ping(), 3)
            finally:
                await client.aclose()
    except Exception:
        return False
    return True


async def prepare_broker(broker: str, url: str, names: Names) -> None:
    """Create what must exist before the relay publishes (a publish to nowhere fails)."""
    if broker == "rabbitmq":
        import aio_pika

        conn = await aio_pika.connect(url)
        try:
            channel = await conn.channel()
            quorum = {"x-queue-type": "quorum"}
            await channel.declare_queue(names.dead, durable=True, arguments=quorum)
            # the same arguments RabbitMQConsumer declares the queue with
            arguments = {
                **quorum,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": names.dead,
            }
            await channel.declare_queue(names.topic, durable=True, arguments=arguments)
        finally:
            await conn.close()
    elif broker == "nats":
        import nats

        nc = await nats.connect(url)
        try:
            await nc.jetstream().add_stream(
                name=names.nats_stream,
                subjects=[names.topic],
                duplicate_window=NATS_DUPLICATE_WINDOW,
            )
        finally:
            await nc.close()
    elif broker == "sqs":
        async with _sqs(url) as client:
            for queue in (names.topic, names.sqs_dead):
                await client.create_queue(QueueName=queue)
    elif broker == "kafka":
        from onceonly.brokers.kafka._wire import ensure_topics

        topics = [(names.topic, KAFKA_PARTITIONS), (names.dead, KAFKA_PARTITIONS)]
        config = _kafka_config(url)
        await asyncio.get_running_loop().run_in_executor(None, ensure_topics, config, topics)
    else:
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(url)
        try:
            await client.xgroup_create(names.topic, CONSUMER, id="0", mkstream=True)
        finally:
            await client.aclose()


async def cleanup_broker(broker: str, url: str, names: Names) -> None:
    """Delete the pipeline's queues, streams or keys (what is not there is skipped)."""
    if broker == "rabbitmq":
        import aio_pika

        conn = await aio_pika.connect(url)
        try:
            channel = await conn.channel()
            for queue in (names.topic, names.dead):
                with contextlib.suppress(Exception):
                    await channel.queue_delete(queue)
        finally:
            await conn.close()
    elif broker == "nats":
        import nats
        import nats.js.errors

        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            for stream in (names.nats_stream, f"{names.nats_stream}_dead"):
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    await js.delete_stream(stream)
        finally:
            await nc.close()
    elif broker == "sqs":
        async with _sqs(url) as client:
            for queue in (names.topic, names.sqs_dead):
                with contextlib.suppress(Exception):
                    found = await client.get_queue_url(QueueName=queue)
                    await client.delete_queue(QueueUrl=found["QueueUrl"])
    elif broker == "kafka":
        from confluent_kafka.admin import AdminClient

        def delete() -> None:
            admin = AdminClient(_kafka_config(url))
            for future in admin.delete_topics([names.topic, names.dead]).values():
                with contextlib.suppress(Exception):
                    future.result(5)

        await asyncio.get_running_loop().run_in_executor(None, delete)
    else:
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(url)
        try:
            await client.delete(names.topic, names.dead)
        finally:
            await client.aclose()


def _kafka_config(url: str) -> dict[str, Any]:
    from onceonly.brokers.kafka._publisher import bootstrap_of

    return {"bootstrap.servers": bootstrap_of(url)}


def _sqs(url: str) -> Any:
    """An aiobotocore SQS client on ``url`` (an async context manager)."""
    from aiobotocore.session import get_session

    return get_session().create_client("sqs", endpoint_url=url, **SQS_OPTIONS)
