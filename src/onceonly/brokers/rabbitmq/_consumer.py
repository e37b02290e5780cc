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
  more than ``max_deliveries`` times (a handler that kills the worker), of which the
  store counted ``max_deliveries - 1`` as its own runs, is dead-lettered without
  running the handler (the broker also counts messages a crashed worker merely held:
  see :mod:`onceonly.brokers._loop`). Classic queues only have the ``redelivered`` flag
  (``delivery_count`` is then ``None``, and ``max_deliveries`` cannot apply: only the
  inbox's ``max_attempts`` ends a poison message there). The declared queue
  dead-letters to the same dead-letter queue, so a message the broker itself gives up
  on (a quorum queue's ``delivery-limit``, 20 by default since RabbitMQ 4.0: keep
  ``max_deliveries`` well below it, as it counts every crash a message was held
  through) lands there too;
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

import logging
from collections.abc import Callable
from typing import Any

try:
    import aio_pika  # noqa: F401
    from aio_pika.abc import AbstractConnection
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "onceonly.brokers.rabbitmq needs the rabbitmq extra: pip install 'onceonly[rabbitmq]'"
    ) from exc

from onceonly.brokers._consumer import Handler, MessageIds
from onceonly.brokers._loop import ConsumerLoop
from onceonly.brokers.rabbitmq._publisher import RabbitMQPublisher
from onceonly.brokers.rabbitmq._transport import RabbitMQTransport
from onceonly.errors import ConfigurationError
from onceonly.inbox import AsyncInbox

__all__ = ["RabbitMQConsumer", "RabbitMQPublisher"]

log = logging.getLogger("onceonly.brokers.rabbitmq")


class RabbitMQConsumer(ConsumerLoop):
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
        message_id: the inbox key. ``None``: the broker's id (the AMQP ``message_id``).
            ``"content"`` (a hash of the payload), a payload field name or a callable:
            **that** is the key, over the broker's id.
            :class:`~onceonly.brokers.MessageIds` ``(fallback=...)``: the broker's id
            first, the fallback for a message without one.
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
        batch_size: deliveries processed together in one inbox transaction
            (``inbox.process_batch``: one commit, each settled by its own outcome);
            1 (the default) runs one at a time. Deliveries in flight are at least
            ``batch_size``.
        batch_wait: seconds a batch waits for more deliveries once the first arrived.

    .. versionadded:: 0.1
    .. versionchanged:: 0.3 ``batch_size``, ``batch_wait``.
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
        batch_size: int = 1,
        batch_wait: float = 0.01,
    ) -> None:
        if (url is None) == (connection is None):
            raise ConfigurationError("pass exactly one of url= or connection=")
        if not queue:
            raise ConfigurationError("queue must be a non-empty queue name")
        if queue_type not in ("quorum", "classic"):
            raise ConfigurationError("queue_type must be 'quorum' or 'classic'")
        super().__init__(
            inbox,
            handler,
            message_id=message_id,
            max_deliveries=max_deliveries,
            retry_delay=retry_delay,
            max_backoff=max_backoff,
            dedup_window=dedup_window,
            concurrency=concurrency,
            shutdown_timeout=shutdown_timeout,
            logger=log,
            batch_size=batch_size,
            batch_wait=batch_wait,
        )
        self.queue = queue
        self.url = url
        self.declare = declare
        self.queue_type = queue_type
        self.queue_arguments = dict(queue_arguments or {})
        self.dead_letter = dead_letter or f"{queue}.dead"
        self.dead_letter_exchange = dead_letter_exchange
        self.prefetch = prefetch or self.concurrency
        self.publish_timeout = publish_timeout
        self.transport = self._transport = RabbitMQTransport(
            queue=queue,
            url=url,
            connection=connection,
            declare=declare,
            queue_type=queue_type,
            queue_arguments=self.queue_arguments,
            dead_letter=self.dead_letter,
            dead_letter_exchange=dead_letter_exchange,
            prefetch=self.prefetch,
            publish_timeout=publish_timeout,
            log=log,
        )

    @property
    def _connection(self) -> AbstractConnection | None:
        """The connection in use (the one given, or the one the consumer opened)."""
        return self._transport.connection
