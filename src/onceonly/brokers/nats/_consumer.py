# SPDX-License-Identifier: MIT
"""NATS JetStream (through nats-py): an outbox publisher and an inbox consumer.

Publisher (:class:`NatsPublisher`):

* ``publish`` sends to JetStream and returns only once the stream's PubAck arrived;
  no stream for the subject, an API error (e.g. a wrong expected stream), a timeout or
  a lost connection raise :class:`~onceonly.PublishError`;
* the outbox row id travels as the ``Nats-Msg-Id`` header, so JetStream also drops a
  re-publish inside its duplicate window, and the consumer's inbox drops it after;
* the subject is ``subject_prefix + message.topic``;
* after a connection loss the next ``publish`` opens a new connection (when the
  publisher opened it itself).

Consumer (:class:`NatsConsumer`):

* binds to a durable **pull** consumer (created with ``ack_policy=explicit``,
  ``ack_wait`` and unlimited ``max_deliver`` when it does not exist yet) and fetches
  at most as many messages as it has free handler slots, so nothing waits unprocessed
  while its ``ack_wait`` runs;
* each message runs ``inbox.process(message_id, payload, handler)`` and is settled by
  the verdict table of :mod:`onceonly._core.settle`: acked only after the inbox's
  commit; nak'ed with a jittered, growing delay when the handler failed; a dead
  message (dead key, payload mismatch, no usable id, undecodable body, result too
  large, too many deliveries) is first published (PubAck awaited) to the dead-letter
  subject with the ``onceonly-*`` headers and only then acked. A dead-letter publish
  that fails leaves the message for redelivery: never a silent drop. The dead-letter
  copy's ``Nats-Msg-Id`` is ``<durable>:<stream>:<sequence>``, so a redelivery
  dead-lettered twice is stored once. A transient store error or a duplicate in flight
  is retried with backoff while the consumer keeps the message (in progress), so
  JetStream's delivery count does not move;
* JetStream's delivery count (``num_delivered``) gives ``tx.delivery.delivery_count``;
  a message delivered more than ``max_deliveries`` times (a handler that kills the
  worker) is dead-lettered without running the handler. The durable's own
  ``max_deliver`` stays unlimited: past it JetStream would stop delivering the message
  without dead-lettering it;
* while a handler runs, ``+WPI`` (in progress) is sent every ``ack_wait / 3`` seconds so
  JetStream does not redeliver a message whose handler is merely slow;
* the dead-letter subject must not match the consumer's own filter (it would loop
  back); when no stream captures it, a stream ``<stream>_dead`` is created for it;
* ``stop()`` stops fetching, naks what the last fetch returned, lets running handlers
  finish and settle (up to ``shutdown_timeout``; the rest are cancelled, roll back and
  are nak'ed), then closes what the consumer opened.

Logs go to ``onceonly.brokers.nats`` with the message id on every line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

try:
    import nats  # noqa: F401
    from nats.aio.client import Client
    from nats.js import JetStreamContext
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "onceonly.brokers.nats needs the nats extra: pip install 'onceonly[nats]'"
    ) from exc

from onceonly._core.deadletter import HEADER_SOURCE
from onceonly.brokers._consumer import Handler, MessageIds
from onceonly.brokers._loop import ConsumerLoop
from onceonly.brokers.nats._publisher import NatsPublisher
from onceonly.brokers.nats._transport import NatsTransport
from onceonly.brokers.nats._wire import MSG_ID_HEADER, is_literal, subject_matches
from onceonly.errors import ConfigurationError
from onceonly.inbox import AsyncInbox

__all__ = ["HEADER_SOURCE", "MSG_ID_HEADER", "NatsConsumer", "NatsPublisher"]

log = logging.getLogger("onceonly.brokers.nats")


class NatsConsumer(ConsumerLoop):
    """Consumes a JetStream durable pull consumer through an :class:`~onceonly.AsyncInbox`.

    Args:
        inbox: the inbox that deduplicates and records each message.
        handler: ``async handler(payload, tx)``; ``tx.delivery`` describes the delivery.
        stream: the stream to consume (it must exist).
        subject: the consumer's filter subject (wildcards allowed).
        durable: the durable consumer's name; created if missing, else bound as is.
        url: a NATS URL; the consumer opens the connection (reconnecting for ever) and
            closes it on stop.
        connection: a nats-py client to use instead (left open on stop).
        ack_wait: seconds JetStream waits for an ack before redelivering (used when the
            durable is created; an existing durable keeps its own, which the heartbeat
            then follows).
        batch: the most messages one fetch asks for (the prefetch).
        concurrency: handlers running at once (default: ``batch``).
        message_id: the inbox key. ``None``: the broker's id (the ``Nats-Msg-Id`` header).
            ``"content"`` (a hash of the payload), a payload field name or a callable:
            **that** is the key, over the broker's id.
            :class:`~onceonly.brokers.MessageIds` ``(fallback=...)``: the broker's id
            first, the fallback for a message without one.
        dead_letter: the dead-letter subject; default ``"<subject>.dead"`` for a literal
            subject, ``"<stream>.dead"`` when ``subject`` has wildcards.
        create_dead_letter_stream: create a stream ``<stream>_dead`` for the dead-letter
            subject when no stream captures it.
        max_deliveries: a message JetStream delivered more times than this is
            dead-lettered, reason ``max-deliveries``, without running the handler; a
            handler failure on the last allowed delivery is dead-lettered at once.
            Default: the inbox's ``max_attempts`` + 5.
        retry_delay: the first nak delay after a handler failure (seconds); it doubles
            with each delivery, jittered. Transient store errors are retried in place
            on the same backoff.
        max_backoff: the longest such delay.
        poll_timeout: how long one fetch waits for messages (bounds how long ``stop``
            waits for the fetch in progress).
        publish_timeout: seconds to wait for the dead-letter PubAck.
        shutdown_timeout: seconds ``stop()`` waits for running handlers.
        dedup_window: at start, when the inbox's ttl is shorter than the redelivery
            horizon the consumer can read: ``"warn"``, ``"refuse"`` (raise
            :class:`~onceonly.ConfigurationError`) or ``"off"``.
        connect_options: keyword options for ``nats.connect``.
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
        stream: str,
        subject: str,
        durable: str,
        url: str | None = None,
        connection: Client | None = None,
        ack_wait: float = 30.0,
        batch: int = 32,
        concurrency: int | None = None,
        message_id: MessageIds | str | Callable[[Any], str] | None = None,
        dead_letter: str | None = None,
        create_dead_letter_stream: bool = True,
        max_deliveries: int | None = None,
        retry_delay: float = 0.1,
        max_backoff: float = 5.0,
        poll_timeout: float = 1.0,
        publish_timeout: float = 5.0,
        shutdown_timeout: float = 30.0,
        connect_options: Mapping[str, Any] | None = None,
        dedup_window: str = "warn",
        batch_size: int = 1,
        batch_wait: float = 0.01,
    ) -> None:
        if (url is None) == (connection is None):
            raise ConfigurationError("pass exactly one of url= or connection=")
        if not stream or not subject or not durable:
            raise ConfigurationError("stream, subject and durable must be non-empty")
        if batch < 1:
            raise ConfigurationError("batch must be at least 1")
        if ack_wait <= 0 or poll_timeout <= 0 or publish_timeout <= 0:
            raise ConfigurationError("ack_wait, poll_timeout and publish_timeout must be > 0")
        dead = dead_letter or (f"{subject}.dead" if is_literal(subject) else f"{stream}.dead")
        if not is_literal(dead):
            raise ConfigurationError(f"dead_letter must be a literal subject, not {dead!r}")
        if subject_matches(subject, dead):
            raise ConfigurationError(
                f"the dead-letter subject {dead!r} matches the consumer's subject {subject!r}: "
                "dead letters would come back; pass another dead_letter="
            )
        super().__init__(
            inbox,
            handler,
            message_id=message_id,
            max_deliveries=max_deliveries,
            retry_delay=retry_delay,
            max_backoff=max_backoff,
            dedup_window=dedup_window,
            concurrency=concurrency or batch,
            shutdown_timeout=shutdown_timeout,
            logger=log,
            batch_size=batch_size,
            batch_wait=batch_wait,
        )
        self.stream = stream
        self.subject = subject
        self.durable = durable
        self.url = url
        self.ack_wait = ack_wait
        self.batch = batch
        self.dead_letter = dead
        self.create_dead_letter_stream = create_dead_letter_stream
        self.poll_timeout = poll_timeout
        self.publish_timeout = publish_timeout
        self.connect_options: dict[str, Any] = {
            "max_reconnect_attempts": -1,
            **(connect_options or {}),
        }
        self.transport = self._transport = NatsTransport(
            stream=stream,
            subject=subject,
            durable=durable,
            url=url,
            connection=connection,
            ack_wait=ack_wait,
            dead_letter=dead,
            create_dead_letter_stream=create_dead_letter_stream,
            poll_timeout=poll_timeout,
            publish_timeout=publish_timeout,
            connect_options=self.connect_options,
            max_deliveries=self.max_deliveries,
            log=log,
        )

    @property
    def _sub(self) -> JetStreamContext.PullSubscription | None:
        """The pull subscription, while running."""
        return self._transport.sub

    @property
    def _connection(self) -> Client | None:
        return self._transport.connection
