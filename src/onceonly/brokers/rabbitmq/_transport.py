# SPDX-License-Identifier: MIT
"""RabbitMQ as a :class:`~onceonly.brokers._loop.Transport` (through aio-pika)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
    ConsumerTag,
)

from onceonly._core.window import Bound
from onceonly.brokers._transport import Incoming
from onceonly.brokers.rabbitmq import _wire as wire
from onceonly.errors import PublishError

__all__ = ["RabbitMQTransport"]


class RabbitMQTransport:
    """Consumes one queue (pushed by the broker up to ``prefetch`` unacked messages),
    dead-letters with confirmed publishes on a second channel."""

    delays_retries = False  # a nack requeues at once: the loop waits first
    extend_every: float | None = None  # unacked messages stay with their channel
    drop = staticmethod(wire.drop)

    def __init__(
        self,
        *,
        queue: str,
        url: str | None,
        connection: AbstractConnection | None,
        declare: bool,
        queue_type: str,
        queue_arguments: dict[str, Any],
        dead_letter: str,
        dead_letter_exchange: str,
        prefetch: int,
        publish_timeout: float,
        log: logging.Logger,
    ) -> None:
        self.queue = queue
        self.url = url
        self.declare = declare
        self.queue_type = queue_type
        self.queue_arguments = queue_arguments
        self.dead_letter_queue = dead_letter
        self.dead_letter_exchange = dead_letter_exchange
        self.prefetch = prefetch
        self.publish_timeout = publish_timeout
        self.where = f"queue {queue}"
        self.log = log
        self.connection = connection
        self._owns_connection = connection is None
        self._channel: AbstractChannel | None = None
        self._dl_channel: AbstractChannel | None = None
        self._dl_exchange: AbstractExchange | None = None
        self._queue: AbstractQueue | None = None
        self._tag: ConsumerTag | None = None
        # pushed deliveries; None wakes receive() (stop, or the channel closed)
        self._inbox: asyncio.Queue[AbstractIncomingMessage | None] = asyncio.Queue()
        self._accepting = False
        self._watch: asyncio.Task[None] | None = None
        self._channel_closed = False
        self._window = 1

    async def open(self) -> None:
        if self.connection is None or self.connection.is_closed:
            assert self.url is not None
            self.connection = await aio_pika.connect_robust(self.url)
        conn = self.connection
        self._inbox = asyncio.Queue()
        self._channel = await conn.channel(publisher_confirms=False)
        # a window of one until the loop widens it (a restart after a crash takes the
        # redelivered messages one at a time: see ConsumerLoop)
        self._window = 1
        await self._channel.set_qos(prefetch_count=self._window)
        self._dl_channel = await conn.channel(publisher_confirms=True, on_return_raises=True)
        if self.declare:
            typed: dict[str, Any] = {"x-queue-type": self.queue_type}
            await self._dl_channel.declare_queue(
                self.dead_letter_queue, durable=True, arguments=typed
            )
            arguments: dict[str, Any] = {
                **typed,
                "x-dead-letter-exchange": self.dead_letter_exchange,
                "x-dead-letter-routing-key": self.dead_letter_queue,
                **self.queue_arguments,
            }
            self._queue = await self._channel.declare_queue(
                self.queue, durable=True, arguments=arguments
            )
        else:
            self._queue = await self._channel.get_queue(self.queue, ensure=True)
        self._dl_exchange = (
            await self._dl_channel.get_exchange(self.dead_letter_exchange, ensure=True)
            if self.dead_letter_exchange
            else self._dl_channel.default_exchange
        )
        self._accepting, self._channel_closed = True, False
        self._watch = asyncio.ensure_future(self._watch_channel(self._channel))
        self._tag = await self._queue.consume(self._on_message, no_ack=False)
        self.log.info("consuming %s (dead letters to %s)", self.queue, self.dead_letter_queue)
        if self.queue_type == "classic":
            self.log.warning(
                "%s is a classic queue: it counts no deliveries, so max_deliveries cannot "
                "apply (only the inbox's max_attempts ends a poison message); a message "
                "whose handler kills the worker is redelivered until it is removed",
                self.queue,
            )

    async def bounds(self, redeliveries: Callable[[float, str], Bound]) -> list[Bound]:
        """The queue's message TTL, when this consumer declared it (a policy set on the
        server is not visible over AMQP: ``onceonly doctor``)."""
        ttl_ms = self.queue_arguments.get("x-message-ttl")
        if self.declare and isinstance(ttl_ms, (int, float)) and ttl_ms > 0:
            return [Bound(f"queue {self.queue} x-message-ttl", ttl_ms / 1000)]
        return []

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        if self._accepting:  # else left unacked: requeued when the channel closes
            self._inbox.put_nowait(message)

    async def _watch_channel(self, channel: AbstractChannel) -> None:
        await channel.closed()
        self._channel_closed = True
        self._inbox.put_nowait(None)

    async def widen(self) -> None:
        """The full ``prefetch``: RabbitMQ applies a consumer's prefetch when it starts
        consuming, so the subscription is cancelled and started again (what it holds
        stays unacked on the channel)."""
        queue, channel = self._queue, self._channel
        if self._window == self.prefetch or queue is None or channel is None:
            return
        self._window = self.prefetch
        if self._tag is not None:
            await queue.cancel(self._tag)
            self._tag = None
        await channel.set_qos(prefetch_count=self.prefetch)
        if self._accepting:
            self._tag = await queue.consume(self._on_message, no_ack=False)

    def wake(self) -> None:
        self._inbox.put_nowait(None)

    async def receive(self, limit: int) -> Sequence[Incoming]:
        first = await self._inbox.get()
        messages = [] if first is None else [first]
        while len(messages) < limit and not self._inbox.empty():
            m = self._inbox.get_nowait()
            if m is not None:
                messages.append(m)
        if self._channel_closed and self._accepting:
            raise aiormq.exceptions.ChannelInvalidStateError(
                f"the channel consuming {self.queue!r} closed"
            )
        return [self._incoming(m) for m in messages]

    def _incoming(self, message: AbstractIncomingMessage) -> Incoming:
        return Incoming(
            broker_id=message.message_id or None,
            body=message.body,
            headers=dict(message.headers or {}),
            delivery_count=wire.delivery_count(message, self.queue_type == "quorum"),
            source=self.queue,
            raw=message,
            label=message.message_id or f"delivery {message.delivery_tag}",
            redelivered=bool(message.redelivered),
            content_type=message.content_type or None,
        )

    async def ack(self, d: Incoming) -> None:
        await d.raw.ack()

    async def retry(self, d: Incoming, delay: float) -> None:
        await d.raw.nack(requeue=True)

    async def dead_letter(
        self, d: Incoming, headers: dict[str, Any], message_id: str | None
    ) -> None:
        exchange = self._dl_exchange
        if exchange is None:
            raise PublishError("the consumer is not running", key=d.broker_id)
        dead = wire.dead_letter_message(d.raw, headers, message_id)
        await wire.publish_confirmed(exchange, dead, self.dead_letter_queue, self.publish_timeout)

    async def extend(self, ds: Sequence[Incoming]) -> None:
        """Nothing to extend: the connection's heartbeat keeps the channel."""

    async def stop_receiving(self) -> None:
        self._accepting = False
        if self._queue is not None and self._tag is not None:
            with contextlib.suppress(Exception):
                await self._queue.cancel(self._tag)
        self._tag = None

    async def close(self, graceful: bool) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        for channel in (self._channel, self._dl_channel):
            if channel is not None and not channel.is_closed:
                with contextlib.suppress(Exception):
                    await channel.close()
        self._channel = self._dl_channel = None
        self._queue = self._dl_exchange = None
        if self._owns_connection and self.connection is not None:
            with contextlib.suppress(Exception):
                await self.connection.close()
            self.connection = None
