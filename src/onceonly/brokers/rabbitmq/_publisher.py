# SPDX-License-Identifier: MIT
"""The RabbitMQ outbox publisher (confirmed, mandatory publishes through aio-pika)."""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange

from onceonly.brokers.rabbitmq._wire import outbound, publish_confirmed, translate
from onceonly.errors import ConfigurationError, PublishError
from onceonly.messaging import OutboxMessage

__all__ = ["RabbitMQPublisher"]


class RabbitMQPublisher:
    """Publishes outbox messages to RabbitMQ and waits for the broker's confirmation.

    Args:
        url: an AMQP URL (``amqp://guest:guest@localhost/``); the publisher opens and
            owns the connection, and reopens it after a loss.
        connection: an aio-pika connection to use instead (not closed by ``close``).
        exchange: the exchange to publish to; ``""`` (the default exchange) routes by
            ``message.topic`` as the queue name. A named exchange must exist.
        timeout: seconds to wait for the confirmation.
        persistent: publish with delivery mode 2 (survives a broker restart).

    Safe to call ``publish`` concurrently: confirms are pipelined on one channel.

    .. versionadded:: 0.1
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        connection: AbstractConnection | None = None,
        exchange: str = "",
        timeout: float = 10.0,
        persistent: bool = True,
    ) -> None:
        if (url is None) == (connection is None):
            raise ConfigurationError("pass exactly one of url= or connection=")
        self.url = url
        self.exchange_name = exchange
        self.timeout = timeout
        self.persistent = persistent
        self._connection = connection
        self._owns_connection = connection is None
        self._channel: AbstractChannel | None = None
        self._exchange: AbstractExchange | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def _ready(self) -> AbstractExchange:
        async with self._lock:
            if self._closed:
                raise PublishError("the publisher is closed")
            if (
                self._channel is not None
                and self._exchange is not None
                and not self._channel.is_closed
            ):
                return self._exchange
            where = f"exchange {self.exchange_name!r}"
            with translate(None, where):
                conn = self._connection
                if conn is not None and self._owns_connection and self._channel is not None:
                    # Our channel died. aio-pika leaves ``is_closed`` false on a lost
                    # connection (it is true only after close()), so do not trust the
                    # old connection: drop it and open a fresh one.
                    with contextlib.suppress(Exception):
                        await conn.close()
                    conn = self._connection = None
                    self._channel = self._exchange = None
                if conn is None or conn.is_closed:
                    if not self._owns_connection:
                        raise PublishError("the connection passed to the publisher is closed")
                    assert self.url is not None
                    conn = self._connection = await aio_pika.connect(self.url)
                channel = await conn.channel(publisher_confirms=True, on_return_raises=True)
                exchange: AbstractExchange = (
                    await channel.get_exchange(self.exchange_name, ensure=True)
                    if self.exchange_name
                    else channel.default_exchange
                )
            self._channel, self._exchange = channel, exchange
            return exchange

    async def connect(self) -> None:
        """Connect now (a relay does at start-up, so bad credentials or an unknown host
        stop it at once instead of failing every row later).

        Raises:
            BrokerUnavailable: the broker cannot be reached or refused the login.
            PublishError: the named exchange does not exist.

        .. versionadded:: 0.2
        """
        await self._ready()

    async def publish(self, message: OutboxMessage) -> None:
        """Publish ``message`` with ``message.id`` as its AMQP ``message_id``.

        Returns once the broker confirmed it.

        Raises:
            PublishError: refused (nack), unroutable (no queue bound), the exchange is
                missing.
            BrokerUnavailable: no confirmation within ``timeout``, or the connection
                failed (transient).
        """
        amqp = outbound(message, persistent=self.persistent)
        exchange = await self._ready()
        await publish_confirmed(exchange, amqp, message.topic, self.timeout)

    async def close(self) -> None:
        """Close the channel, and the connection when the publisher opened it."""
        async with self._lock:
            self._closed = True
            channel, self._channel, self._exchange = self._channel, None, None
            with contextlib.suppress(Exception):
                if channel is not None and not channel.is_closed:
                    await channel.close()
            if self._owns_connection and self._connection is not None:
                with contextlib.suppress(Exception):
                    await self._connection.close()
                self._connection = None

    async def __aenter__(self) -> RabbitMQPublisher:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
