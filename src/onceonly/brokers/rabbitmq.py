# SPDX-License-Identifier: MIT
"""RabbitMQ (AMQP 0-9-1, through aio-pika): an outbox publisher and an inbox consumer.

Publisher (:class:`RabbitMQPublisher`):

* publishes on a channel with publisher confirms and ``mandatory=True``, so ``publish``
  returns only once the broker has taken the message; a nack, an unroutable message
  (``basic.return``), a missing exchange, a timeout or a lost connection raise
  :class:`~onceonly.PublishError`;
* the outbox row id travels as the AMQP ``message_id`` (aiormq matches returns to
  publishes by it, so ids must be unique among the messages in flight: UUIDv7s are);
* after a connection loss the next ``publish`` opens a new connection (when the
  publisher opened it itself) or a new channel.

Consumer (:class:`RabbitMQConsumer`):

* each delivery runs ``inbox.process(message_id, payload, handler)`` and is settled by
  the verdict table of :mod:`onceonly._core.settle`: acked only after the inbox's
  commit; nacked with requeue after a jittered backoff when the handler failed; a dead
  message (dead key, payload mismatch, no usable id, undecodable body, result too
  large, too many deliveries) is first published (confirmed) to the dead-letter queue
  with the ``onceonly-*`` headers and only then acked. A dead-letter publish that fails
  leaves the message for redelivery: never a silent drop. A transient store error or a
  duplicate in flight is retried with backoff while the consumer keeps the message;
* the queue is declared durable and, by default, as a quorum queue, whose
  ``x-delivery-count`` header gives ``tx.delivery.delivery_count``: a message delivered
  more than ``max_deliveries`` times (a handler that kills the worker) is dead-lettered
  without running the handler. Classic queues only have the ``redelivered`` flag
  (``delivery_count`` is then ``None``, and ``max_deliveries`` cannot apply: only the
  inbox's ``max_attempts`` ends a poison message there). The declared queue
  dead-letters to the same dead-letter queue, so a message the broker itself gives up
  on (a quorum queue's ``delivery-limit``, 20 by default since RabbitMQ 4.0: keep
  ``max_deliveries`` below it) lands there too;
* RabbitMQ has no per-message visibility timeout: an unacked message stays with its
  consumer until the channel closes, or until the broker's ``consumer_timeout``
  (default 30 minutes) closes the channel. Handlers are coroutines, so the connection's
  heartbeat keeps running while they await; nothing needs renewing. A handler that
  may run longer than ``consumer_timeout`` needs that broker setting raised;
* ``stop()`` cancels the subscription, lets running handlers finish and settle (up to
  ``shutdown_timeout``; the rest are cancelled, roll back and are redelivered), then
  closes what the consumer opened.

Logs go to ``onceonly.brokers.rabbitmq`` with the message id on every line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

try:
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
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "onceonly.brokers.rabbitmq needs the rabbitmq extra: pip install 'onceonly[rabbitmq]'"
    ) from exc

from onceonly._core.settle import Action, Backoff, header_text
from onceonly._core.window import Bound
from onceonly.brokers._consumer import (
    Deliveries,
    Handler,
    InFlightTracker,
    MessageIds,
    Settlement,
    decode_body,
    pause,
    unexpected,
)
from onceonly.errors import BrokerUnavailable, ConfigurationError, PublishError
from onceonly.inbox_async import AsyncInbox
from onceonly.messaging import (
    HEADER_ATTEMPTS,
    HEADER_ERROR,
    HEADER_KEY,
    HEADER_MESSAGE_ID,
    HEADER_REASON,
    Delivery,
    OutboxMessage,
)

__all__ = ["RabbitMQConsumer", "RabbitMQPublisher"]

log = logging.getLogger("onceonly.brokers.rabbitmq")

JSON = "application/json"
RETRY_DELAY_CAP = 1.0  # pause before requeueing a message whose dead-letter publish failed


@contextlib.contextmanager
def _translate(message_id: str | None, where: str) -> Iterator[None]:
    """Map every aio-pika/aiormq failure of one publish to :class:`PublishError`."""
    try:
        yield
    except aiormq.exceptions.PublishError as exc:
        raise PublishError(f"unroutable: {where} has no queue bound", key=message_id) from exc
    except aiormq.exceptions.DeliveryError as exc:
        raise PublishError(
            f"the broker refused the message (nack) on {where}", key=message_id
        ) from exc
    except aiormq.exceptions.ChannelNotFoundEntity as exc:
        raise PublishError(f"{where}: not found ({exc})", key=message_id) from exc
    except (TimeoutError, asyncio.TimeoutError) as exc:  # distinct classes on 3.10
        raise BrokerUnavailable(f"{where} did not confirm in time", key=message_id) from exc
    except (
        aiormq.exceptions.AMQPConnectionError,
        aiormq.exceptions.ChannelInvalidStateError,
        aiormq.exceptions.InvalidFrameError,  # e.g. the server closed the login (vhost)
        ConnectionError,
        OSError,
        RuntimeError,
    ) as exc:
        # the broker is unreachable or the connection went away: transient
        raise BrokerUnavailable(
            f"connection to the broker failed: {exc!r}", key=message_id
        ) from exc
    except aiormq.exceptions.AMQPError as exc:  # a channel-level refusal of this message
        raise PublishError(
            f"the broker refused the message on {where}: {exc!r}", key=message_id
        ) from exc


async def _publish_confirmed(
    exchange: AbstractExchange, message: aio_pika.Message, routing_key: str, timeout: float
) -> None:
    """Publish mandatory on a confirming channel; raise PublishError unless confirmed."""
    where = f"exchange {exchange.name!r} routing key {routing_key!r}"
    with _translate(message.message_id, where):
        result = await exchange.publish(message, routing_key, mandatory=True, timeout=timeout)
    if isinstance(result, aiormq.abc.DeliveredMessage):  # returned, on_return_raises=False
        raise PublishError(f"unroutable: {where} has no queue bound", key=message.message_id)
    if not isinstance(result, aiormq.spec.Basic.Ack):
        raise PublishError(f"{where} did not confirm the message", key=message.message_id)


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
            with _translate(None, where):
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
        headers: dict[str, Any] = dict(message.headers)
        if message.key:
            headers[HEADER_KEY] = message.key
        amqp = aio_pika.Message(
            message.body,
            message_id=message.id,
            headers=headers,
            content_type=JSON,
            delivery_mode=(
                aio_pika.DeliveryMode.PERSISTENT
                if self.persistent
                else aio_pika.DeliveryMode.NOT_PERSISTENT
            ),
        )
        exchange = await self._ready()
        await _publish_confirmed(exchange, amqp, message.topic, self.timeout)

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


class RabbitMQConsumer:
    """Consumes a RabbitMQ queue through an :class:`~onceonly.AsyncInbox`.

    Args:
        inbox: the inbox that deduplicates and records each message.
        handler: ``async handler(payload, tx)``; ``tx.delivery`` describes the delivery.
        queue: the queue to consume.
        url: an AMQP URL; the consumer opens a robust connection (it reconnects and
            resumes consuming after a broker restart) and closes it on stop.
        connection: an aio-pika connection to use instead (left open on stop).
        declare: declare the queue (durable, ``queue_type``, dead-lettering to
            ``dead_letter``) and the dead-letter queue. With ``False`` both must exist.
        queue_type: ``"quorum"`` (the default; gives delivery counts) or ``"classic"``;
            with ``declare=False``, the type the existing queue has.
        queue_arguments: extra arguments for the queue declaration.
        message_id: a :class:`MessageIds`, or its fallback when a message carries no
            ``message_id``: ``None``, ``"content"``, a payload field name or a callable.
        dead_letter: the dead-letter queue (default ``"<queue>.dead"``).
        dead_letter_exchange: publish dead letters to this exchange, with
            ``dead_letter`` as routing key (default: the default exchange).
        concurrency: handlers running at once.
        prefetch: unacked messages the broker sends ahead (default: ``concurrency``).
        max_deliveries: a message delivered more times than this (quorum queues count)
            is dead-lettered, reason ``max-deliveries``, without running the handler;
            a handler failure on the last allowed delivery is dead-lettered at once.
            Default: the inbox's ``max_attempts`` + 5.
        retry_delay: the first backoff step (seconds) before requeueing a message whose
            handler failed, and before retrying a transient store error; it doubles
            with each delivery (jittered, capped at ``max_backoff``). The message is
            held meanwhile.
        max_backoff: the longest such delay.
        publish_timeout: seconds to wait for the dead-letter publish's confirmation.
        shutdown_timeout: seconds ``stop()`` waits for running handlers.
        dedup_window: at start, when the inbox's ttl is shorter than the redelivery
            horizon the consumer can read: ``"warn"``, ``"refuse"`` (raise
            :class:`~onceonly.ConfigurationError`) or ``"off"``.

    .. versionadded:: 0.1
    """

    def __init__(
        self,
        inbox: AsyncInbox,
        handler: Handler,
        *,
        queue: str,
        url: str | None = None,
        connection: AbstractConnection | None = None,
        declare: bool = True,
        queue_type: str = "quorum",
        queue_arguments: dict[str, Any] | None = None,
        message_id: MessageIds | str | Callable[[Any], str] | None = None,
        dead_letter: str | None = None,
        dead_letter_exchange: str = "",
        concurrency: int = 16,
        prefetch: int | None = None,
        max_deliveries: int | None = None,
        retry_delay: float = 0.1,
        max_backoff: float = 5.0,
        publish_timeout: float = 10.0,
        shutdown_timeout: float = 30.0,
        dedup_window: str = "warn",
    ) -> None:
        if (url is None) == (connection is None):
            raise ConfigurationError("pass exactly one of url= or connection=")
        if not queue:
            raise ConfigurationError("queue must be a non-empty queue name")
        if queue_type not in ("quorum", "classic"):
            raise ConfigurationError("queue_type must be 'quorum' or 'classic'")
        self.inbox = inbox
        self.handler = handler
        self.queue = queue
        self.url = url
        self.declare = declare
        self.queue_type = queue_type
        self.queue_arguments = dict(queue_arguments or {})
        self.ids = message_id if isinstance(message_id, MessageIds) else MessageIds(message_id)
        self.dead_letter = dead_letter or f"{queue}.dead"
        self.dead_letter_exchange = dead_letter_exchange
        self.concurrency = concurrency
        self.prefetch = prefetch or concurrency
        self.retry_delay = retry_delay
        self.max_backoff = max_backoff
        self._deliveries = Deliveries(
            inbox,
            handler,
            self.ids,
            max_deliveries=max_deliveries,
            backoff=Backoff(retry_delay, max_backoff),
            logger=log,
            dedup_window=dedup_window,
        )
        self.max_deliveries = self._deliveries.max_deliveries
        self.publish_timeout = publish_timeout
        self.shutdown_timeout = shutdown_timeout
        self._tracker = InFlightTracker(concurrency)
        self._connection = connection
        self._owns_connection = connection is None
        self._channel: AbstractChannel | None = None
        self._dl_channel: AbstractChannel | None = None
        self._dl_exchange: AbstractExchange | None = None
        self._queue: AbstractQueue | None = None
        self._consumer_tag: ConsumerTag | None = None
        self._stop: asyncio.Event | None = None
        self._done: asyncio.Event | None = None
        self._started = asyncio.Event()
        self._accepting = False
        self._task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        """Consume until :meth:`stop` is called or the task is cancelled.

        A cancellation does not wait: running handlers are cancelled, their
        transactions roll back and the broker redelivers their messages.

        Raises:
            aio_pika.exceptions.AMQPError: the broker could not be reached, or a
                connection the consumer does not own was lost.
        """
        if self._done is not None:
            raise RuntimeError("this consumer is already running")
        self._done = asyncio.Event()
        self._stop = asyncio.Event()
        graceful = False
        try:
            await self._start()
            self._started.set()
            assert self._channel is not None
            stop_wait = asyncio.ensure_future(self._stop.wait())
            closed = asyncio.ensure_future(self._channel.closed())
            try:
                await asyncio.wait({stop_wait, closed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop_wait.cancel()
                closed.cancel()
            if not self._stop.is_set():
                raise aiormq.exceptions.ChannelInvalidStateError(
                    f"the channel consuming {self.queue!r} closed"
                )
            graceful = True
        finally:
            try:
                await self._shutdown(self.shutdown_timeout if graceful else 0.0)
            finally:
                done, self._done, self._stop = self._done, None, None
                self._started = asyncio.Event()
                done.set()

    async def stop(self) -> None:
        """Stop taking messages, let running handlers finish and settle, then close.

        Returns once the shutdown is over (at most about ``shutdown_timeout``).
        """
        done, stop = self._done, self._stop
        if done is None or stop is None:
            return
        stop.set()
        await done.wait()

    async def __aenter__(self) -> RabbitMQConsumer:
        self._task = task = asyncio.ensure_future(self.run())
        started = asyncio.ensure_future(self._started.wait())
        await asyncio.wait({started, task}, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            started.cancel()
            task.result()  # raises the startup error
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        task, self._task = self._task, None
        await self.stop()
        if task is not None:
            await task  # re-raises a lost connection

    def _check_window(self) -> None:
        """The inbox ttl against the queue's message TTL, when this consumer declared it
        (a policy set on the server is not visible over AMQP: ``onceonly doctor``)."""
        ttl_ms = self.queue_arguments.get("x-message-ttl")
        if self.declare and isinstance(ttl_ms, (int, float)) and ttl_ms > 0:
            bound = Bound(f"queue {self.queue} x-message-ttl", ttl_ms / 1000)
            self._deliveries.check_window([bound], f"queue {self.queue}")

    async def _start(self) -> None:
        if self._connection is None or self._connection.is_closed:
            assert self.url is not None
            self._connection = await aio_pika.connect_robust(self.url)
        conn = self._connection
        self._channel = await conn.channel(publisher_confirms=False)
        await self._channel.set_qos(prefetch_count=self.prefetch)
        self._dl_channel = await conn.channel(publisher_confirms=True, on_return_raises=True)
        if self.declare:
            typed: dict[str, Any] = {"x-queue-type": self.queue_type}
            await self._dl_channel.declare_queue(self.dead_letter, durable=True, arguments=typed)
            arguments: dict[str, Any] = {
                **typed,
                "x-dead-letter-exchange": self.dead_letter_exchange,
                "x-dead-letter-routing-key": self.dead_letter,
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
        self._check_window()
        self._accepting = True
        self._consumer_tag = await self._queue.consume(self._on_message, no_ack=False)
        log.info("consuming %s (dead letters to %s)", self.queue, self.dead_letter)
        if self.queue_type == "classic":
            log.warning(
                "%s is a classic queue: it counts no deliveries, so max_deliveries cannot "
                "apply (only the inbox's max_attempts ends a poison message); a message "
                "whose handler kills the worker is redelivered until it is removed",
                self.queue,
            )

    async def _shutdown(self, timeout: float) -> None:
        self._accepting = False
        if self._queue is not None and self._consumer_tag is not None:
            with contextlib.suppress(Exception):
                await self._queue.cancel(self._consumer_tag)
        self._consumer_tag = None
        await self._tracker.drain(timeout)
        for channel in (self._channel, self._dl_channel):
            if channel is not None and not channel.is_closed:
                with contextlib.suppress(Exception):
                    await channel.close()
        self._channel = self._dl_channel = None
        self._queue = self._dl_exchange = None
        if self._owns_connection and self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()
            self._connection = None
        log.info("stopped consuming %s", self.queue)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        if not self._accepting:
            return  # stopping: left unacked, the broker requeues it when the channel closes
        self._tracker.spawn(self._handle(message))

    async def _handle(self, message: AbstractIncomingMessage) -> None:
        async with self._tracker.semaphore:
            label = message.message_id or f"delivery {message.delivery_tag}"
            try:
                result = await self._process(message, label)
            except Exception as exc:  # a bug of ours: still settle the message
                log.exception("%s: unexpected error; requeueing it", label)
                result = unexpected(exc, self._deliveries.delay(1))
            try:
                await self._settle(message, result)
            except Exception:
                log.exception("%s: could not settle it; requeueing it", label)
                with contextlib.suppress(Exception):
                    await message.nack(requeue=True)

    async def _process(self, message: AbstractIncomingMessage, label: str) -> Settlement:
        headers = dict(message.headers or {})
        count = self._delivery_count(headers.get("x-delivery-count"))

        def delivery(message_id: str) -> Delivery:
            return Delivery(
                message_id=message_id,
                source=self.queue,
                delivery_count=count,
                redelivered=bool(message.redelivered),
                headers=headers,
                raw=message,
            )

        return await self._deliveries.process(
            broker_id=message.message_id or None,
            decode=lambda: decode_body(message.body),
            delivery=delivery,
            delivery_count=count,
            stop=self._stop,
            label=label,
        )

    def _delivery_count(self, header: Any) -> int | None:
        """Quorum queues count earlier deliveries in ``x-delivery-count`` (absent on the
        first); classic queues count nothing."""
        if isinstance(header, int) and not isinstance(header, bool):
            return header + 1
        return 1 if self.queue_type == "quorum" else None

    async def _settle(self, message: AbstractIncomingMessage, result: Settlement) -> None:
        mid = result.message_id or message.message_id or "<no id>"
        v = result.verdict
        try:
            if v.action is Action.ACK:
                await message.ack()
                if v.reason:
                    log.warning("%s: acked (%s: %s)", mid, v.reason, v.error)
                else:
                    log.debug("%s: acked (replayed=%s)", mid, result.replayed)
                return
            if v.action is Action.RETRY:
                # counted: back off, then hand it back (the broker counts the delivery);
                # uncounted: only when stopping, so hand it back at once
                if v.counted:
                    await pause(self._stop, v.delay)
                await message.nack(requeue=True)
                log.info("%s: requeued (%s)", mid, v.reason)
                return
            try:
                await self._dead_letter(message, result)
            except PublishError as exc:
                log.error("%s: dead-letter publish failed, leaving it for redelivery: %s", mid, exc)
                await pause(self._stop, RETRY_DELAY_CAP)
                await message.nack(requeue=True)
                return
            await message.ack()
            log.warning("%s: dead-lettered to %s (%s)", mid, self.dead_letter, v.reason)
        except (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError) as exc:
            # The channel is gone: the broker redelivers, and the inbox replays or retries.
            log.warning(
                "%s: could not settle (%s); it will be redelivered: %r",
                mid,
                v.action.value,
                exc,
            )

    async def _dead_letter(self, message: AbstractIncomingMessage, result: Settlement) -> None:
        """Publish the original body and properties plus the onceonly-* headers, confirmed.

        A message that carried no id keeps none of its own; aiormq then gives the copy a
        random AMQP ``message_id`` (it matches broker returns by it).
        """
        exchange = self._dl_exchange
        if exchange is None:
            raise PublishError("the consumer is not running", key=message.message_id)
        message_id = result.message_id
        v = result.verdict
        headers: dict[str, Any] = dict(message.headers or {})
        # the broker's count of this delivery: a redrive must start counting afresh
        headers.pop("x-delivery-count", None)
        headers[HEADER_REASON] = v.reason or "dead"
        headers[HEADER_ERROR] = header_text(v.error or "")
        headers[HEADER_ATTEMPTS] = str(v.attempts or 0)
        if message_id:
            headers[HEADER_MESSAGE_ID] = header_text(message_id)
        dead = aio_pika.Message(
            message.body,
            headers=headers,
            content_type=message.content_type or JSON,
            content_encoding=message.content_encoding,
            message_id=message.message_id or message_id,
            correlation_id=message.correlation_id,
            timestamp=message.timestamp,
            type=message.type,
            app_id=message.app_id,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        await _publish_confirmed(exchange, dead, self.dead_letter, self.publish_timeout)
