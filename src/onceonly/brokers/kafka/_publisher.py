# SPDX-License-Identifier: MIT
"""The Kafka outbox publisher (an idempotent producer; each publish awaits its delivery
report)."""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from onceonly.brokers.kafka import _wire as wire
from onceonly.errors import ConfigurationError, PublishError
from onceonly.messaging import OutboxMessage

__all__ = ["KafkaPublisher", "bootstrap_of"]


def bootstrap_of(url: str) -> str:
    """``kafka://host:port[,host:port]`` → ``host:port[,host:port]`` (a bare
    ``host:port`` passes as it is)."""
    if "://" not in url:
        return url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() != "kafka" or not parts.netloc:
        raise ConfigurationError(f"not a kafka:// URL: {url!r}")
    return parts.netloc


class KafkaPublisher:
    """Publishes outbox messages to Kafka and waits for each delivery report.

    Args:
        bootstrap: ``host:port[,host:port…]`` or a ``kafka://host:port`` URL.
        config: confluent-kafka producer settings (security, ``linger.ms`` …).
        timeout: seconds a publish may take (``message.timeout.ms``).

    The outbox topic is the Kafka topic; the row id travels as the
    ``onceonly-message-id`` header and the row's key as the record key (one key, one
    partition: per-key order). The producer is idempotent (``enable.idempotence``): a
    retry inside the client never writes a record twice. Safe to call ``publish``
    concurrently.

    .. versionadded:: 0.4
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        config: Mapping[str, Any] | None = None,
        timeout: float = 10.0,
    ) -> None:
        if timeout <= 0:
            raise ConfigurationError("timeout must be positive")
        self.bootstrap = bootstrap_of(bootstrap)
        self.config = wire.client_config(self.bootstrap, config, consumer=False)
        self.timeout = timeout
        self._producer: wire.AsyncProducer | None = None
        self._closed = False

    def _ready(self) -> wire.AsyncProducer:
        if self._closed:
            raise PublishError("the publisher is closed")
        if self._producer is None:
            self._producer = wire.AsyncProducer(self.config, self.timeout)
        return self._producer

    async def connect(self) -> None:
        """Reach the broker now (a relay does at start-up).

        Raises:
            BrokerUnavailable: the broker cannot be reached.
        """
        self._ready()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, wire.partitions_of, self.config, [])

    async def publish(self, message: OutboxMessage) -> None:
        """Publish ``message`` to the topic ``message.topic``; return once written.

        Raises:
            PublishError: the broker refused the record.
            BrokerUnavailable: no delivery report within ``timeout``, or the broker is
                unreachable (transient).
        """
        producer = self._ready()
        await producer.produce(
            message.topic,
            message.body,
            key=message.key.encode("utf-8") if message.key else None,
            headers=wire.outbound_headers(message),
            message_id=message.id,
        )

    async def close(self) -> None:
        """Wait for records in flight (up to ``timeout``), then release the producer."""
        self._closed = True
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.close()

    async def __aenter__(self) -> KafkaPublisher:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
