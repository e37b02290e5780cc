# SPDX-License-Identifier: MIT
"""Redis Streams (through redis-py's asyncio client): an outbox publisher and an inbox consumer.

An entry carries the fields ``id`` (the message id, the outbox row id), ``payload`` (the
JSON text), ``headers`` (a JSON object of string headers, ``content-type`` and
``onceonly-key`` among them) and ``key`` (the ordering key, when there is one). The
entry id itself is assigned by Redis. Needs Redis 6.2 or later (XAUTOCLAIM).

Publisher (:class:`RedisStreamsPublisher`):

* ``publish`` is one XADD to ``stream_prefix + topic``; its reply (the new entry id) is
  Redis's confirmation, so ``publish`` returns only once Redis holds the entry. A key
  that is not a stream (WRONGTYPE), any other refusal, a timeout or a lost connection
  raise :class:`~onceonly.PublishError`. The client's pool reconnects on the next call.

Consumer (:class:`RedisStreamsConsumer`), one member of a consumer group:

* every entry runs ``inbox.process(message_id, payload, handler)`` and is XACKed only
  after the inbox's commit (or its replay of a completed key); entries settled while
  an XACK is on the wire share the next XACK, and each waits for its own;
* a dead entry is first XADDed (confirmed) to the dead-letter stream with the
  ``onceonly-*`` headers and only then XACKed. If that XADD fails the entry is not
  acked: never a silent drop;
* every entry is settled by the verdict table of :mod:`onceonly._core.settle`. An entry
  whose handler failed is not acked: it stays in this consumer's pending entries list
  (PEL) and is fetched again after a jittered backoff (XCLAIM by this consumer, only
  while it still owns the entry; Redis counts the delivery). A transient store error or
  a duplicate in flight is retried with backoff while the consumer keeps the entry, so
  the count does not move. A consumer that dies leaves its entries pending; every
  consumer runs XAUTOCLAIM every ``claim_idle / 2`` seconds and takes over entries idle
  for ``claim_idle`` seconds (Redis counts that delivery too);
* an entry delivered more than ``max_deliveries`` times (a handler that kills the
  worker) is dead-lettered without running the handler;
* the message id is the ``id`` field (else the ``onceonly-message-id`` header): valid
  UTF-8 is taken as is; any other bytes, and a valid id that itself starts with
  ``b64:``, become ``b64:`` + their base64, so distinct ids stay distinct keys;
* while a handler runs, and while a failed entry waits for its retry, the consumer
  resets the entry's idle time every ``claim_idle / 3`` seconds (XCLAIM ... JUSTID,
  which leaves the delivery count alone, and only if it still owns the entry), so a
  live consumer's entries are never taken over;
* ``tx.delivery.delivery_count`` is Redis's count: 1 for a new entry, XPENDING's
  count for an entry taken over or fetched again;
* ``stop()`` stops reading (within ``block_ms``), lets running handlers finish and
  settle (up to ``shutdown_timeout``; the rest are cancelled, roll back and stay
  pending for a takeover), removes this consumer from the group if it holds no
  pending entries, and closes what it opened.

Logs go to ``onceonly.brokers.redis_streams`` with the message id (or, before it is
known, the entry id) on every line.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from typing import Any

try:
    import redis.asyncio
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "onceonly.brokers.redis_streams needs the redis extra: pip install 'onceonly[redis]'"
    ) from exc

from onceonly.brokers._consumer import Handler, MessageIds
from onceonly.brokers._loop import ConsumerLoop
from onceonly.brokers.redis_streams._publisher import RedisStreamsPublisher
from onceonly.brokers.redis_streams._transport import RedisStreamsTransport
from onceonly.brokers.redis_streams._wire import StreamEntry, client
from onceonly.errors import ConfigurationError
from onceonly.inbox import AsyncInbox

__all__ = ["RedisStreamsConsumer", "RedisStreamsPublisher", "StreamEntry"]

log = logging.getLogger("onceonly.brokers.redis_streams")


class RedisStreamsConsumer(ConsumerLoop):
    """Consumes a Redis stream as a member of a consumer group, through an inbox.

    Args:
        inbox: the inbox that deduplicates and records each message.
        handler: ``async handler(payload, tx)``; ``tx.delivery`` describes the delivery.
        stream: the stream key to consume.
        group: the consumer group; created (with MKSTREAM) if missing.
        url: a Redis URL; the consumer opens the client and closes it on stop.
        connection: a ``redis.asyncio.Redis`` to use instead (left open on stop). It
            needs a connection pool (the blocking read holds one connection) and no
            ``socket_timeout`` shorter than ``block_ms``.
        consumer_name: this member's name (default ``<hostname>-<pid>``); unique per
            running consumer.
        start_id: where a newly created group starts: ``"0"`` (the whole stream, the
            default) or ``"$"`` (only new entries).
        block_ms: how long one read blocks; also the longest a ``stop()`` waits for it.
        count: entries fetched per read (at most the free handler slots; at least
            ``batch_size``).
        concurrency: handlers running at once.
        claim_idle: seconds after which another consumer's pending entry is taken over.
        max_deliveries: an entry delivered more times than this (Redis's delivery
            counter) is dead-lettered, reason ``max-deliveries``, without running the
            handler; a handler failure on the last allowed delivery is dead-lettered at
            once. Default: the inbox's ``max_attempts`` + 5.
        retry_delay: seconds before a failed entry is fetched again (doubling with each
            delivery, jittered, capped at ``max_backoff``). Transient store errors are
            retried in place on the same backoff.
        max_backoff: the longest such delay (default ``max(retry_delay, claim_idle)``).
        message_id: the inbox key. ``None``: the broker's id (the entry's ``id`` field).
            ``"content"`` (a hash of the payload), a payload field name or a callable:
            **that** is the key, over the broker's id.
            :class:`~onceonly.brokers.MessageIds` ``(fallback=...)``: the broker's id
            first, the fallback for a message without one.
        dead_letter: the dead-letter stream (default ``"<stream>.dead"``).
        shutdown_timeout: seconds ``stop()`` waits for running handlers.
        dedup_window: at start, when the inbox's ttl is shorter than the redelivery
            horizon (``max_deliveries`` x ``claim_idle``): ``"warn"``, ``"refuse"`` (raise
            :class:`~onceonly.ConfigurationError`) or ``"off"``.
        **options: passed to ``redis.asyncio.Redis.from_url`` with ``url``.

    An entry without a ``payload`` field is read as the JSON object of its other fields.
        batch_size: deliveries processed together in one inbox transaction
            (``inbox.process_batch``: one commit, each settled by its own outcome);
            1 (the default) runs one at a time. Deliveries in flight are at least
            ``batch_size``.
        batch_wait: seconds a batch waits for more deliveries once the first arrived.
        forget_idle: members of the group idle this many seconds with nothing pending
            are deleted (at start, then every ``forget_idle / 2``): a consumer killed
            with SIGKILL never leaves the group itself, and the default name is new
            with each process. Its pending entries are taken over (``claim_idle``)
            first; the check and the delete are one atomic script. ``None``: never.

    .. versionadded:: 0.1
    .. versionchanged:: 0.3 ``batch_size``, ``batch_wait``.
    .. versionchanged:: 0.4 ``forget_idle``.
    """

    def __init__(
        self,
        inbox: AsyncInbox,
        handler: Handler,
        *,
        stream: str,
        group: str,
        url: str | None = None,
        connection: redis.asyncio.Redis | None = None,
        consumer_name: str | None = None,
        start_id: str = "0",
        block_ms: int = 1000,
        count: int = 16,
        concurrency: int = 16,
        claim_idle: float = 30.0,
        max_deliveries: int | None = None,
        retry_delay: float = 1.0,
        max_backoff: float | None = None,
        message_id: MessageIds | str | Callable[[Any], str] | None = None,
        dead_letter: str | None = None,
        shutdown_timeout: float = 30.0,
        dedup_window: str = "warn",
        batch_size: int = 1,
        batch_wait: float = 0.01,
        forget_idle: float | None = 3600.0,
        **options: Any,
    ) -> None:
        if not stream or not group:
            raise ConfigurationError("stream and group must be non-empty")
        if block_ms < 1 or count < 1 or concurrency < 1:
            raise ConfigurationError("block_ms, count and concurrency must be at least 1")
        if claim_idle <= 0 or retry_delay < 0 or shutdown_timeout < 0:
            raise ConfigurationError("claim_idle must be positive; delays not negative")
        if forget_idle is not None and forget_idle < max(claim_idle, block_ms / 1000):
            raise ConfigurationError(
                "forget_idle must be at least claim_idle and block_ms (or None: never)"
            )
        super().__init__(
            inbox,
            handler,
            message_id=message_id,
            max_deliveries=max_deliveries,
            retry_delay=retry_delay,
            max_backoff=max(retry_delay, claim_idle) if max_backoff is None else max_backoff,
            dedup_window=dedup_window,
            concurrency=concurrency,
            shutdown_timeout=shutdown_timeout,
            logger=log,
            batch_size=batch_size,
            batch_wait=batch_wait,
        )
        self.stream = stream
        self.group = group
        self.consumer_name = consumer_name or f"{socket.gethostname()}-{os.getpid()}"
        self.start_id = start_id
        self.block_ms = block_ms
        self.count = count
        self.claim_idle = claim_idle
        self.dead_letter = dead_letter or f"{stream}.dead"
        self._client: redis.asyncio.Redis = client(url, connection, options)
        self.transport = self._transport = RedisStreamsTransport(
            self._client,
            owns_client=connection is None,
            stream=stream,
            group=group,
            consumer_name=self.consumer_name,
            start_id=start_id,
            block_ms=block_ms,
            count=max(count, batch_size),
            claim_idle=claim_idle,
            dead_letter=self.dead_letter,
            log=log,
            forget_idle=forget_idle,
        )

    async def ensure_group(self) -> None:
        """Create the group (and the stream) unless it exists."""
        await self._transport.ensure_group()
