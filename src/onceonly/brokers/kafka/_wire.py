# SPDX-License-Identifier: MIT
"""Kafka's wire format and the confluent-kafka client bridged to asyncio: one place for
the publisher, the consumer and the dead letters (headers, ids, confirmed produces,
topics, error translation).

confluent-kafka (librdkafka) is synchronous: delivery reports are served by
``Producer.poll``, which :class:`AsyncProducer` runs in a thread of its own, handing
each report to the event loop. The event loop never blocks on the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # exported at run time
    AdminClient,
    ConfigResource,
    ResourceType,
)
from confluent_kafka.cimpl import NewTopic

from onceonly._core.window import Bound
from onceonly.errors import BrokerUnavailable, ConfigurationError, PublishError
from onceonly.messaging import HEADER_KEY, HEADER_MESSAGE_ID, OutboxMessage

__all__ = [
    "AsyncProducer",
    "client_config",
    "ensure_topics",
    "headers_of",
    "outbound_headers",
    "record_id",
    "retention_bounds",
]

#: Client settings that only a consumer takes (left out of the producer's and admin's).
_CONSUMER_ONLY = (
    "group.",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "auto.offset.reset",
    "enable.auto",
    "max.poll.interval.ms",
    "partition.assignment.strategy",
    "fetch.",
    "isolation.level",
    "enable.partition.eof",
)


def client_config(
    bootstrap: str, config: Mapping[str, Any] | None, *, consumer: bool
) -> dict[str, Any]:
    """The client settings: ``config`` over ``bootstrap.servers`` (consumer-only keys
    left out when ``consumer`` is false)."""
    merged: dict[str, Any] = {"bootstrap.servers": bootstrap}
    for k, v in (config or {}).items():
        if not consumer and k.startswith(_CONSUMER_ONLY):
            continue
        merged[k] = v
    return merged


def headers_of(message: Message) -> dict[str, Any]:
    """A record's headers as a dict: UTF-8 values as ``str``, others as ``bytes``
    (a repeated name keeps its last value)."""
    out: dict[str, Any] = {}
    raw = message.headers() or []
    pairs = list(raw.items()) if isinstance(raw, dict) else list(raw)
    for name, value in pairs:
        if isinstance(value, bytes):
            try:
                out[name] = value.decode("utf-8")
            except UnicodeDecodeError:
                out[name] = value
        else:
            out[name] = value
    return out


def record_id(message: Message) -> str:
    """``topic/partition/offset``: the id of a record that carries none."""
    return f"{message.topic()}/{message.partition()}/{message.offset()}"


def encode_headers(headers: Mapping[str, Any]) -> list[tuple[str, bytes]]:
    """Headers for a produce: ``str`` values UTF-8, ``bytes`` as they are."""
    out: list[tuple[str, bytes]] = []
    for name, value in headers.items():
        if value is None:
            continue
        data = value if isinstance(value, bytes) else str(value).encode("utf-8")
        out.append((str(name), data))
    return out


def outbound_headers(message: OutboxMessage) -> list[tuple[str, bytes]]:
    """The headers of an outbox row's record: its id as ``onceonly-message-id``, its key
    as ``onceonly-key``, and the row's own headers."""
    headers: dict[str, Any] = dict(message.headers)
    headers[HEADER_MESSAGE_ID] = message.id
    if message.key:
        headers[HEADER_KEY] = message.key
    return encode_headers(headers)


_TRANSIENT = {
    KafkaError._TRANSPORT,
    KafkaError._MSG_TIMED_OUT,
    KafkaError._TIMED_OUT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._RESOLVE,
    KafkaError.NETWORK_EXCEPTION,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KafkaError._QUEUE_FULL,
}


def publish_error(err: KafkaError, key: str | None, where: str) -> PublishError:
    """``BrokerUnavailable`` for what says the broker was not reached, else
    ``PublishError`` (the record was refused)."""
    text = f"{where}: {err.str()} ({err.name()})"
    if err.code() in _TRANSIENT or err.retriable():
        return BrokerUnavailable(text, key=key)
    return PublishError(text, key=key)


class AsyncProducer:
    """An idempotent confluent-kafka producer whose produces are awaited until the
    broker's delivery report.

    Args:
        config: the client settings (``bootstrap.servers`` and the rest).
        timeout: seconds a produce may take before it fails (``message.timeout.ms``).
    """

    def __init__(self, config: Mapping[str, Any], timeout: float) -> None:
        settings = {
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": max(1, int(timeout * 1000)),
            "linger.ms": 1,
            **config,
        }
        self.timeout = timeout
        self._producer = Producer(settings)
        self._running = True
        self._thread = threading.Thread(target=self._serve, name="onceonly-kafka-producer")
        self._thread.daemon = True
        self._thread.start()

    def _serve(self) -> None:
        while self._running:
            self._producer.poll(0.05)

    async def produce(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None,
        headers: Sequence[tuple[str, bytes]],
        message_id: str | None = None,
    ) -> Message:
        """Produce one record; return it once the broker acknowledged it.

        Raises:
            BrokerUnavailable: not acknowledged in time, or the broker is unreachable.
            PublishError: the broker refused the record.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Message] = loop.create_future()
        where = f"topic {topic!r}"

        def report(err: KafkaError | None, msg: Message) -> None:
            def settle() -> None:
                if done.done():
                    return
                if err is not None:
                    done.set_exception(publish_error(err, message_id, where))
                else:
                    done.set_result(msg)

            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle)

        try:
            self._producer.produce(
                topic, value=value, key=key, headers=list(headers), on_delivery=report
            )
        except BufferError as exc:
            raise BrokerUnavailable(f"{where}: the producer queue is full", key=message_id) from exc
        except KafkaException as exc:
            raise publish_error(exc.args[0], message_id, where) from exc
        try:
            # the report comes within message.timeout.ms; the margin covers a stalled poll
            return await asyncio.wait_for(done, self.timeout + 5.0)
        except (asyncio.TimeoutError, TimeoutError) as exc:
            raise BrokerUnavailable(f"{where} did not acknowledge in time", key=message_id) from exc

    async def close(self) -> None:
        """Wait for what is in flight (up to ``timeout``), then stop serving reports."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._producer.flush, self.timeout)
        self._running = False
        await loop.run_in_executor(None, self._thread.join)


def ensure_topics(
    config: Mapping[str, Any], topics: Iterable[tuple[str, int]], timeout: float = 10.0
) -> None:
    """Create the topics ``(name, partitions)`` that do not exist (blocking: call it in a
    thread). A topic created meanwhile by someone else is fine.

    Raises:
        BrokerUnavailable: the broker did not answer.
        ConfigurationError: the broker refused to create a topic.
    """
    admin = AdminClient(dict(config))
    try:
        existing = set(admin.list_topics(timeout=timeout).topics)
    except KafkaException as exc:
        raise BrokerUnavailable(f"cannot list the topics: {exc}") from exc
    missing = [NewTopic(name, num_partitions=n) for name, n in topics if name not in existing]
    if not missing:
        return
    for name, future in admin.create_topics(missing, request_timeout=timeout).items():
        try:
            future.result(timeout)
        except KafkaException as exc:
            err = exc.args[0]
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise ConfigurationError(f"cannot create topic {name!r}: {exc}") from exc


def partitions_of(
    config: Mapping[str, Any], topics: Iterable[str], timeout: float = 10.0
) -> dict[str, int]:
    """How many partitions each existing topic has (blocking)."""
    admin = AdminClient(dict(config))
    try:
        meta = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise BrokerUnavailable(f"cannot list the topics: {exc}") from exc
    wanted = set(topics)
    return {n: len(t.partitions) for n, t in meta.topics.items() if n in wanted and t.error is None}


def retention_bounds(
    config: Mapping[str, Any], topics: Iterable[str], timeout: float = 10.0
) -> tuple[list[Bound], list[str]]:
    """How long each topic keeps a record (blocking): a group may read a record again
    (a reset, a lost position) as long as it is kept. Returns the bounds read
    (``retention.ms``; ``math.inf`` for ``-1`` or a compacted topic that deletes
    nothing) and the topics whose retention the broker did not report (unknown: a
    missing topic, or a broker that answers ``DescribeConfigs`` without it, as Tansu
    does for a topic created without one).

    Raises:
        BrokerUnavailable: the broker did not answer.
    """
    admin = AdminClient(dict(config))
    names = list(dict.fromkeys(topics))
    futures = admin.describe_configs(
        [ConfigResource(ResourceType.TOPIC, t) for t in names], request_timeout=timeout
    )
    bounds: list[Bound] = []
    unknown: list[str] = []
    for resource, future in futures.items():
        name = resource.name
        try:
            entries = future.result(timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and (err.code() in _TRANSIENT or err.retriable()):
                raise BrokerUnavailable(
                    f"cannot read the configs of topic {name!r}: {exc}"
                ) from exc
            unknown.append(name)
            continue
        policy = entries.get("cleanup.policy")
        retention = entries.get("retention.ms")
        if (
            policy is not None
            and "compact" in str(policy.value)
            and "delete" not in str(policy.value)
        ):
            bounds.append(Bound(f"topic {name} cleanup.policy={policy.value}", math.inf))
        elif retention is None or retention.value is None:
            unknown.append(name)
        else:
            try:
                ms = int(retention.value)
            except ValueError:
                unknown.append(name)
                continue
            seconds = math.inf if ms < 0 else ms / 1000
            bounds.append(Bound(f"topic {name} retention.ms", seconds))
    return bounds, sorted(unknown, key=names.index)
