# SPDX-License-Identifier: MIT
"""Amazon SQS (through aiobotocore): an outbox publisher and an inbox consumer.

Consumer (:class:`SqsConsumer`), on the same loop as the other brokers:

* long-polls ``ReceiveMessage`` (up to 10 messages, at most the free handler slots);
  the message id is the ``onceonly-message-id`` attribute (the outbox id), else a FIFO
  queue's deduplication id, else SQS's ``MessageId`` (unless ``message_id=`` gives a
  fallback); a ``message_id=`` given as ``"content"``, a field name or a callable is
  the key instead; ``ApproximateReceiveCount`` is the delivery count;
* acked (``DeleteMessage``) only after the inbox's commit; a failed handler's message
  becomes visible again after the jittered backoff (``ChangeMessageVisibility``); a
  dead message is sent (confirmed) to the dead-letter queue with the ``onceonly-*``
  attributes, then deleted;
* while handlers run, their messages' visibility timeout is extended every
  ``visibility_timeout / 3`` (``ChangeMessageVisibilityBatch``);
* redrive-policy aware: without ``dead_letter=``, dead letters go to the queue's
  redrive target; a ``maxReceiveCount`` at or below ``max_deliveries`` is warned about
  (SQS would move such messages itself, without onceonly's headers).

Logs go to ``onceonly.brokers.sqs``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

try:
    from aiobotocore.session import get_session
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "onceonly.brokers.sqs needs the sqs extra: pip install 'onceonly[sqs]'"
    ) from exc

from onceonly.brokers._consumer import Handler, MessageIds
from onceonly.brokers._loop import ConsumerLoop
from onceonly.brokers.sqs._publisher import SqsPublisher
from onceonly.brokers.sqs._transport import SqsTransport
from onceonly.errors import ConfigurationError
from onceonly.inbox import AsyncInbox

__all__ = ["SqsConsumer", "SqsPublisher"]

log = logging.getLogger("onceonly.brokers.sqs")


class SqsConsumer(ConsumerLoop):
    """Consumes an SQS queue through an :class:`~onceonly.AsyncInbox`.

    Args:
        inbox: the inbox that deduplicates and records each message.
        handler: ``async handler(payload, tx)``; ``tx.delivery.raw`` is the SQS message.
        queue: the queue name (it must exist).
        session: an ``aiobotocore`` session (default: a new one).
        dead_letter: the dead-letter queue name (default: the redrive target, else
            ``<queue>-dead``, created when missing unless
            ``create_dead_letter_queue=False``).
        visibility_timeout: seconds a received message stays invisible (extended
            while its handler runs).
        wait_time: the long-poll wait in seconds (0-20; bounds how long ``stop`` waits).
        concurrency: as for the other consumers.
        max_deliveries: as for the other consumers.
        retry_delay: as for the other consumers.
        max_backoff: as for the other consumers.
        message_id: as for the other consumers.
        shutdown_timeout: as for the other consumers.
        dedup_window: as for the other consumers.
        batch_size: deliveries processed together in one inbox transaction
            (``inbox.process_batch``: one commit, each settled by its own outcome);
            1 (the default) runs one at a time. Deliveries in flight are at least
            ``batch_size``.
        batch_wait: seconds a batch waits for more deliveries once the first arrived.
        **client_options: for ``session.create_client("sqs", ...)``.

    .. versionadded:: 0.3
    """

    def __init__(
        self,
        inbox: AsyncInbox,
        handler: Handler,
        *,
        queue: str,
        session: Any = None,
        dead_letter: str | None = None,
        create_dead_letter_queue: bool = True,
        visibility_timeout: int = 30,
        wait_time: int = 1,
        concurrency: int = 10,
        max_deliveries: int | None = None,
        retry_delay: float = 1.0,
        max_backoff: float = 30.0,
        message_id: MessageIds | str | Callable[[Any], str] | None = None,
        shutdown_timeout: float = 30.0,
        dedup_window: str = "warn",
        batch_size: int = 1,
        batch_wait: float = 0.01,
        **client_options: Any,
    ) -> None:
        if not queue:
            raise ConfigurationError("queue must be a non-empty queue name")
        if visibility_timeout < 1 or not 0 <= wait_time <= 20:
            raise ConfigurationError("visibility_timeout must be >= 1 and wait_time in 0..20")
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
        self.transport = self._transport = SqsTransport(
            session=session or get_session(),
            client_options=client_options,
            queue=queue,
            dead_letter=dead_letter,
            create_dead_letter_queue=create_dead_letter_queue,
            visibility_timeout=visibility_timeout,
            wait_time=wait_time,
            fallback=self.ids.fallback is not None,
            max_deliveries=self.max_deliveries,
            log=log,
        )

    @property
    def dead_letter(self) -> str | None:
        """The dead-letter queue (known once running when it is the redrive target)."""
        return self._transport.dead_letter_queue
