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

import asyncio
import base64
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

try:
    import redis.asyncio
    from redis.exceptions import RedisError, ResponseError
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "onceonly.brokers.redis_streams needs the redis extra: pip install 'onceonly[redis]'"
    ) from exc

from onceonly._core.settle import Action, Backoff, header_text
from onceonly.brokers._consumer import (
    Deliveries,
    Handler,
    InFlightTracker,
    MessageIds,
    Settlement,
    decode_body,
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

__all__ = ["RedisStreamsConsumer", "RedisStreamsPublisher", "StreamEntry"]

log = logging.getLogger("onceonly.brokers.redis_streams")

FIELD_ID = "id"
FIELD_PAYLOAD = "payload"
FIELD_HEADERS = "headers"
FIELD_KEY = "key"
JSON = "application/json"
HEARTBEAT_BATCH = 500
#: Marks a message id that was not valid UTF-8 (or already started with it): base64 follows.
B64_PREFIX = "b64:"

# Reset the idle time of the entries this consumer still owns; returns the ids kept.
_HEARTBEAT = """
local kept = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p > 0 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    kept[#kept + 1] = ARGV[i]
  end
end
return kept
"""

# Fetch again an entry this consumer still owns: nil if it does not, {} if the entry
# was deleted from the stream, else {entry, delivery count}.
_REFETCH = """
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then return false end
local e = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3])
if #e == 0 or not e[1][2] then return {} end
p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
return {e[1], p[1][4]}
"""

# Leave the group on a clean stop, unless entries are still pending on this consumer.
_LEAVE = """
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) > 0 then return -1 end
return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
"""


def _text(value: bytes | str) -> str:
    """For entry ids, field names and log lines (not message ids: see _message_id)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _message_id(value: Any) -> str:
    """The message id of an ``id`` field or header, injectively.

    Valid UTF-8 is kept as is, unless it starts with ``b64:``; anything else (and such
    an id) becomes ``b64:`` + the standard base64 of its bytes. So two distinct ids never
    share a key (decoding with replacement characters would merge them).
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return B64_PREFIX + base64.b64encode(raw).decode("ascii")
    else:
        text = value if isinstance(value, str) else str(value)
        try:
            raw = text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates, e.g. from a JSON header
            raw = text.encode("utf-8", "surrogatepass")
            return B64_PREFIX + base64.b64encode(raw).decode("ascii")
    if text.startswith(B64_PREFIX):
        return B64_PREFIX + base64.b64encode(raw).decode("ascii")
    return text


#: Error replies that say Redis cannot take writes right now, not that it refuses this
#: entry (loading a dataset, out of memory, a read-only replica, a busy script, cluster
#: resharding or failover).
_TRANSIENT_REPLIES = ("LOADING", "OOM", "READONLY", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN")


def _transient_reply(exc: ResponseError) -> bool:
    return str(exc).split(" ", 1)[0].upper() in _TRANSIENT_REPLIES


def _client(url: str | None, connection: redis.asyncio.Redis | None, options: Any) -> Any:
    if (url is None) == (connection is None):
        raise ConfigurationError("pass exactly one of url= or connection=")
    if connection is not None:
        return connection
    assert url is not None
    return redis.asyncio.Redis.from_url(url, **options)


def _entry_fields(
    message_id: str | None, payload: bytes | str, headers: Mapping[str, str], key: str | None
) -> dict[str, bytes | str]:
    fields: dict[str, bytes | str] = {}
    if message_id:
        fields[FIELD_ID] = message_id
    fields[FIELD_PAYLOAD] = payload
    fields[FIELD_HEADERS] = json.dumps(dict(headers), separators=(",", ":"))
    if key is not None:
        fields[FIELD_KEY] = key
    return fields


@dataclass(frozen=True)
class StreamEntry:
    """A stream entry as the consumer read it (``tx.delivery.raw``).

    Attributes:
        stream: the stream key.
        entry_id: the id Redis assigned (``1700000000000-0``).
        fields: the entry's fields, names decoded, values as the client returned them.
    """

    stream: str
    entry_id: str
    fields: Mapping[str, bytes | str]


class RedisStreamsPublisher:
    """Publishes outbox messages to Redis streams; XADD's reply is the confirmation.

    Args:
        url: a Redis URL (``redis://localhost:6379/0``); the publisher opens and owns
            the client, and closes it on ``close``.
        connection: a ``redis.asyncio.Redis`` to use instead (not closed by ``close``).
        stream_prefix: prepended to ``message.topic`` to form the stream key.
        maxlen: trim each stream to about this many entries (``MAXLEN ~``).
        timeout: seconds to wait for the XADD reply.
        **options: passed to ``redis.asyncio.Redis.from_url`` with ``url``.

    Safe to call ``publish`` concurrently: each call takes a connection from the pool.

    .. versionadded:: 0.1
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        connection: redis.asyncio.Redis | None = None,
        stream_prefix: str = "",
        maxlen: int | None = None,
        timeout: float = 10.0,
        **options: Any,
    ) -> None:
        if maxlen is not None and maxlen < 1:
            raise ConfigurationError("maxlen must be at least 1")
        self._client: redis.asyncio.Redis = _client(url, connection, options)
        self._owns_client = connection is None
        self.stream_prefix = stream_prefix
        self.maxlen = maxlen
        self.timeout = timeout
        self._closed = False

    def stream_for(self, topic: str) -> str:
        """The stream key ``topic`` maps to."""
        return f"{self.stream_prefix}{topic}"

    async def connect(self) -> None:
        """Check Redis answers now (a relay does at start-up: a wrong URL or password
        stops it at once).

        Raises:
            BrokerUnavailable: Redis cannot be reached or refused the login.

        .. versionadded:: 0.2
        """
        try:
            await asyncio.wait_for(self._client.ping(), self.timeout)
        except (RedisError, OSError, asyncio.TimeoutError, TimeoutError) as exc:
            raise BrokerUnavailable(f"cannot reach Redis: {exc!r}") from exc

    async def publish(self, message: OutboxMessage) -> None:
        """XADD ``message`` to its stream and return once Redis replied with the entry id.

        Raises:
            PublishError: the key is not a stream, or Redis refused the entry.
            BrokerUnavailable: no reply within ``timeout``, the connection failed, or
                Redis is loading, out of memory, read-only or down (transient).
        """
        stream = self.stream_for(message.topic)
        if self._closed:
            raise PublishError("the publisher is closed", key=message.id)
        headers = {"content-type": JSON, **message.headers}
        if message.key is not None:
            headers[HEADER_KEY] = message.key
        fields = _entry_fields(message.id, message.payload, headers, message.key)
        try:
            entry_id = await asyncio.wait_for(
                self._client.xadd(stream, fields, maxlen=self.maxlen, approximate=True),  # type: ignore[arg-type]
                self.timeout,
            )
        except ResponseError as exc:
            kind = BrokerUnavailable if _transient_reply(exc) else PublishError
            raise kind(
                f"Redis refused the entry on stream {stream!r}: {exc}", key=message.id
            ) from exc
        except (asyncio.TimeoutError, TimeoutError) as exc:
            raise BrokerUnavailable(
                f"stream {stream!r} did not confirm within {self.timeout}s", key=message.id
            ) from exc
        except (RedisError, OSError) as exc:
            raise BrokerUnavailable(f"connection to Redis failed: {exc!r}", key=message.id) from exc
        if not entry_id:
            raise PublishError(f"stream {stream!r} did not confirm the entry", key=message.id)
        log.debug("%s: published to %s as %s", message.id, stream, _text(entry_id))

    async def close(self) -> None:
        """Close the client if the publisher opened it."""
        self._closed = True
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> RedisStreamsPublisher:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class RedisStreamsConsumer:
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
        count: entries fetched per read (at most the free handler slots).
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
        message_id: a :class:`MessageIds`, or its fallback when an entry has no ``id``
            field and no ``onceonly-message-id`` header: ``None``, ``"content"``, a
            payload field name or a callable.
        dead_letter: the dead-letter stream (default ``"<stream>.dead"``).
        shutdown_timeout: seconds ``stop()`` waits for running handlers.
        dedup_window: at start, when the inbox's ttl is shorter than the redelivery
            horizon (``max_deliveries`` x ``claim_idle``): ``"warn"``, ``"refuse"`` (raise
            :class:`~onceonly.ConfigurationError`) or ``"off"``.
        **options: passed to ``redis.asyncio.Redis.from_url`` with ``url``.

    An entry without a ``payload`` field is read as the JSON object of its other fields.

    .. versionadded:: 0.1
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
        **options: Any,
    ) -> None:
        if not stream or not group:
            raise ConfigurationError("stream and group must be non-empty")
        if block_ms < 1 or count < 1 or concurrency < 1:
            raise ConfigurationError("block_ms, count and concurrency must be at least 1")
        if claim_idle <= 0 or retry_delay < 0 or shutdown_timeout < 0:
            raise ConfigurationError("claim_idle must be positive; delays not negative")
        self.inbox = inbox
        self.handler = handler
        self.stream = stream
        self.group = group
        self.consumer_name = consumer_name or f"{socket.gethostname()}-{os.getpid()}"
        self.start_id = start_id
        self.block_ms = block_ms
        self.count = count
        self.concurrency = concurrency
        self.claim_idle = claim_idle
        self.retry_delay = retry_delay
        self.max_backoff = max(retry_delay, claim_idle) if max_backoff is None else max_backoff
        self.ids = message_id if isinstance(message_id, MessageIds) else MessageIds(message_id)
        self._deliveries = Deliveries(
            inbox,
            handler,
            self.ids,
            max_deliveries=max_deliveries,
            backoff=Backoff(retry_delay, self.max_backoff),
            logger=log,
            dedup_window=dedup_window,
        )
        self.max_deliveries = self._deliveries.max_deliveries
        self.dead_letter = dead_letter or f"{stream}.dead"
        self.shutdown_timeout = shutdown_timeout
        self._client: redis.asyncio.Redis = _client(url, connection, options)
        self._owns_client = connection is None
        self._heartbeat_script = self._client.register_script(_HEARTBEAT)
        self._refetch_script = self._client.register_script(_REFETCH)
        self._leave_script = self._client.register_script(_LEAVE)
        self._tracker = InFlightTracker(concurrency)
        self._free = concurrency
        self._slots = asyncio.Condition()
        self._active: set[str] = set()  # entries whose handler runs here
        self._retry_at: dict[str, float] = {}  # failed entries we own -> when to refetch
        self._next_claim = 0.0
        self._claim_cursor = "0-0"
        self._stop = asyncio.Event()
        self._done: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._ack_ids: list[str] = []  # acks waiting for the next XACK
        self._ack_done: asyncio.Future[None] | None = None  # resolved by that XACK
        self._ack_task: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------

    async def run(self) -> None:
        """Consume until :meth:`stop` is called or the task is cancelled.

        A cancellation does not wait: running handlers are cancelled, their
        transactions roll back and their entries stay pending for a takeover.

        Raises:
            ConfigurationError: ``stream`` exists and is not a stream.
            redis.exceptions.RedisError: Redis could not be reached at the start. Later
                connection failures are logged and retried with backoff.
        """
        if self._done is not None:
            raise RuntimeError("this consumer already ran; create a new one")
        self._done = asyncio.Event()
        heartbeat: asyncio.Task[None] | None = None
        try:
            if self._stop.is_set():
                return  # stopped before it started
            await self.ensure_group()
            self._deliveries.check_window(
                [self._deliveries.redeliveries_bound(self.claim_idle, "claim_idle")],
                f"stream {self.stream} group {self.group}",
            )
            heartbeat = asyncio.ensure_future(self._heartbeat_loop())
            await self._read_loop()
            await self._tracker.drain(self.shutdown_timeout)
            await self._leave()
        except asyncio.CancelledError:
            await self._tracker.drain(0)
            raise
        except Exception:
            await self._tracker.drain(self.shutdown_timeout)
            raise
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
                await asyncio.gather(heartbeat, return_exceptions=True)
            if self._ack_task is not None:
                await asyncio.gather(self._ack_task, return_exceptions=True)
            if self._owns_client:
                await self._client.aclose()
            self._done.set()

    async def stop(self) -> None:
        """Stop reading, let running handlers finish and settle, then close.

        Waits for :meth:`run` to return. A stopped consumer cannot run again.
        """
        self._stop.set()
        async with self._slots:
            self._slots.notify_all()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        elif self._done is not None:
            await self._done.wait()
        elif self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> RedisStreamsConsumer:
        await self.ensure_group()
        self._task = asyncio.ensure_future(self.run())
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        task = self._task
        await self.stop()
        if task is not None and task.done() and not task.cancelled():
            exc = task.exception()
            if exc is not None and et is None:
                raise exc

    async def ensure_group(self) -> None:
        """Create the group (and the stream) unless it exists."""
        try:
            await self._client.xgroup_create(
                self.stream, self.group, id=self.start_id, mkstream=True
            )
        except ResponseError as exc:
            if "BUSYGROUP" in str(exc):
                return
            raise ConfigurationError(
                f"cannot create group {self.group!r} on {self.stream!r}: {exc}"
            ) from exc

    async def _leave(self) -> None:
        try:
            await self._leave_script(keys=[self.stream], args=[self.group, self.consumer_name])
        except (RedisError, OSError) as exc:
            log.info("%s: could not leave group %s: %r", self.stream, self.group, exc)

    # -- reading -----------------------------------------------------------------------

    async def _take_slots(self) -> int:
        """Wait for a free handler slot; return how many are free (0 when stopping)."""
        async with self._slots:
            await self._slots.wait_for(lambda: self._free > 0 or self._stop.is_set())
            return 0 if self._stop.is_set() else self._free

    async def _read_loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            free = await self._take_slots()
            if not free:
                break
            try:
                free -= await self._refetch_due(free)
                if free and time.monotonic() >= self._next_claim:
                    free -= await self._autoclaim(free)
                if free:
                    await self._read_new(free)
                failures = 0
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                log.warning("%s: group %s vanished; recreating it", self.stream, self.group)
                await self.ensure_group()
            except (RedisError, OSError) as exc:
                failures += 1
                pause = min(0.1 * 2**failures, 5.0)
                log.warning("%s: read failed (%r); retrying in %.1fs", self.stream, exc, pause)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), pause)

    def _block_ms(self) -> int:
        wake = self._next_claim
        if self._retry_at:
            wake = min(wake, *self._retry_at.values())
        until = int((wake - time.monotonic()) * 1000)
        return max(1, min(self.block_ms, until))

    async def _read_new(self, free: int) -> None:
        reply: Any = await self._client.xreadgroup(
            self.group,
            self.consumer_name,
            {self.stream: ">"},
            count=min(free, self.count),
            block=self._block_ms(),
        )
        for _, entries in reply or ():
            for entry_id, fields in entries:
                self._spawn(_text(entry_id), fields, 1)

    async def _autoclaim(self, free: int) -> int:
        """Take over entries idle for ``claim_idle`` (a dead consumer's, or lost ones)."""
        reply: Any = await self._client.xautoclaim(
            self.stream,
            self.group,
            self.consumer_name,
            min_idle_time=int(self.claim_idle * 1000),
            start_id=self._claim_cursor,
            count=free,
        )
        self._claim_cursor = _text(reply[0])
        if self._claim_cursor == "0-0":
            self._next_claim = time.monotonic() + self.claim_idle / 2
        for gone in reply[2] if len(reply) > 2 else ():
            log.warning("entry %s: deleted from the stream before it was acked", _text(gone))
        claimed = [(_text(i), f) for i, f in reply[1] if f and _text(i) not in self._active]
        if not claimed:
            return 0
        async with self._client.pipeline(transaction=False) as pipe:
            for entry_id, _ in claimed:
                pipe.xpending_range(self.stream, self.group, entry_id, entry_id, 1)
            pending = await pipe.execute()
        for (entry_id, fields), info in zip(claimed, pending, strict=True):
            count = int(info[0]["times_delivered"]) if info else 2
            self._retry_at.pop(entry_id, None)
            log.info(
                "%s: took over entry %s (delivery %d)", _label(entry_id, fields), entry_id, count
            )
            self._spawn(entry_id, fields, count)
        return len(claimed)

    async def _refetch_due(self, free: int) -> int:
        """Fetch again the failed entries whose backoff has passed."""
        now = time.monotonic()
        due = sorted((at, e) for e, at in self._retry_at.items() if at <= now)[:free]
        spawned = 0
        for _, entry_id in due:
            reply: Any = await self._refetch_script(
                keys=[self.stream], args=[self.group, self.consumer_name, entry_id]
            )
            self._retry_at.pop(entry_id, None)
            if reply is None:
                log.info("entry %s: another consumer took it over", entry_id)
            elif not reply:
                log.warning("entry %s: deleted from the stream before it was acked", entry_id)
            else:
                (_, flat), count = reply
                fields = dict(zip(flat[::2], flat[1::2], strict=True))
                self._spawn(entry_id, fields, int(count))
                spawned += 1
        return spawned

    def _spawn(self, entry_id: str, fields: Mapping[Any, Any], delivery_count: int) -> None:
        self._free -= 1
        self._active.add(entry_id)
        self._tracker.spawn(self._handle(entry_id, fields, delivery_count))

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.claim_idle / 3)
            ids = sorted(self._active | self._retry_at.keys())
            for i in range(0, len(ids), HEARTBEAT_BATCH):
                batch = ids[i : i + HEARTBEAT_BATCH]
                try:
                    kept = await self._heartbeat_script(
                        keys=[self.stream], args=[self.group, self.consumer_name, *batch]
                    )
                except (RedisError, OSError) as exc:
                    log.warning("%s: heartbeat failed: %r", self.stream, exc)
                    break
                lost = set(batch) - {_text(k) for k in kept}
                for entry_id in lost:
                    if self._retry_at.pop(entry_id, None) is not None:
                        log.info("entry %s: another consumer took it over", entry_id)

    # -- one entry ---------------------------------------------------------------------

    async def _handle(self, entry_id: str, fields: Mapping[Any, Any], delivery_count: int) -> None:
        try:
            await self._process(entry_id, fields, delivery_count)
        except (RedisError, OSError) as exc:
            label = _label(entry_id, fields)
            log.warning("%s: could not settle entry %s: %r", label, entry_id, exc)
            self._retry_later(entry_id, self._deliveries.delay(delivery_count))
        except Exception:
            log.exception("%s: unexpected failure on entry %s", _label(entry_id, fields), entry_id)
            self._retry_later(entry_id, self._deliveries.delay(delivery_count))
        finally:
            self._active.discard(entry_id)
            async with self._slots:
                self._free += 1
                self._slots.notify_all()

    async def _process(self, entry_id: str, raw: Mapping[Any, Any], delivery_count: int) -> None:
        fields = {_text(k): v for k, v in raw.items()}
        headers = _headers(fields.get(FIELD_HEADERS))
        broker_id = fields.get(FIELD_ID) or headers.get(HEADER_MESSAGE_ID)
        broker_id = _message_id(broker_id) if broker_id else None
        entry = StreamEntry(self.stream, entry_id, fields)

        def delivery(message_id: str) -> Delivery:
            return Delivery(
                message_id=message_id,
                source=self.stream,
                delivery_count=delivery_count,
                redelivered=delivery_count > 1,
                headers=headers,
                raw=entry,
            )

        try:
            settlement = await self._deliveries.process(
                broker_id=broker_id,
                decode=lambda: decode_body(_body(fields)),
                delivery=delivery,
                delivery_count=delivery_count,
                stop=self._stop,
                label=broker_id or f"entry {entry_id}",
            )
        except Exception as exc:  # a bug of ours: still settle the entry
            log.exception("%s: unexpected error on entry %s", broker_id, entry_id)
            settlement = unexpected(exc, self._deliveries.delay(delivery_count))
        label = settlement.message_id or broker_id or entry_id
        v = settlement.verdict
        if v.action is Action.ACK:
            await self._ack(entry_id)
            if v.reason:
                log.warning("%s: acked entry %s (%s: %s)", label, entry_id, v.reason, v.error)
            else:
                log.debug("%s: processed and acked entry %s", label, entry_id)
        elif v.action is Action.RETRY:
            if v.counted:  # fetched again after the backoff: Redis counts that delivery
                self._retry_later(entry_id, v.delay)
                log.info(
                    "%s: %s; entry %s fetched again in %.2fs", label, v.reason, entry_id, v.delay
                )
            else:  # stopping: it stays pending, for a takeover or the next run
                log.info("%s: %s; entry %s left pending", label, v.reason, entry_id)
        else:
            await self._dead_letter(entry_id, label, fields, settlement)

    async def _ack(self, entry_id: str) -> None:
        """XACK ``entry_id``, in one XACK with the others acked meanwhile; wait for it."""
        if self._ack_done is None:
            self._ack_done = asyncio.get_running_loop().create_future()
        done = self._ack_done
        self._ack_ids.append(entry_id)
        if self._ack_task is None or self._ack_task.done():
            self._ack_task = asyncio.ensure_future(self._flush_acks())
        await asyncio.shield(done)

    async def _flush_acks(self) -> None:
        while self._ack_ids:
            ids, done = self._ack_ids, self._ack_done
            self._ack_ids, self._ack_done = [], None
            assert done is not None
            try:
                await self._client.xack(self.stream, self.group, *ids)
            except BaseException as exc:
                done.set_exception(exc)
                done.exception()  # retrieved: every waiter may have been cancelled
                if not isinstance(exc, Exception):
                    raise
            else:
                done.set_result(None)

    def _retry_later(self, entry_id: str, delay: float) -> None:
        if not self._stop.is_set():
            self._retry_at[entry_id] = time.monotonic() + delay

    async def _dead_letter(
        self, entry_id: str, label: str, fields: Mapping[str, Any], settlement: Settlement
    ) -> None:
        v, message_id = settlement.verdict, settlement.message_id
        headers = {k: str(value) for k, value in _headers(fields.get(FIELD_HEADERS)).items()}
        headers.update(
            {
                HEADER_REASON: v.reason or "dead",
                HEADER_ERROR: header_text(v.error or ""),
                HEADER_ATTEMPTS: str(v.attempts or 0),
                HEADER_MESSAGE_ID: header_text(message_id or ""),
            }
        )
        key = fields.get(FIELD_KEY)
        original = fields.get(FIELD_ID)
        dead = _entry_fields(None, _body(fields), headers, _text(key) if key else None)
        if original or message_id:
            # the id field as the entry carried it (bytes stay bytes), not its b64: form
            dead = {FIELD_ID: original or message_id or "", **dead}
        try:
            await self._client.xadd(self.dead_letter, dead)  # type: ignore[arg-type]
        except (RedisError, OSError) as exc:
            self._retry_later(entry_id, self._deliveries.delay(1))
            log.error(
                "%s: dead-letter to %s failed (%r); entry %s left pending",
                label,
                self.dead_letter,
                exc,
                entry_id,
            )
            return
        await self._ack(entry_id)
        log.warning(
            "%s: dead-lettered entry %s to %s (%s)",
            label,
            entry_id,
            self.dead_letter,
            v.reason,
        )


def _label(entry_id: str, fields: Mapping[Any, Any]) -> str:
    """The message id for a log line before the entry is parsed (else the entry id)."""
    mid = fields.get(FIELD_ID, fields.get(FIELD_ID.encode()))
    return _text(mid) if mid else f"entry {entry_id}"


def _headers(value: Any) -> dict[str, Any]:
    if not value:
        return {}
    try:
        decoded = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return {}
    return decoded if isinstance(decoded, dict) else {}


def _body(fields: Mapping[str, Any]) -> bytes:
    """The payload field's bytes; without one, the other fields as a JSON object."""
    if FIELD_PAYLOAD in fields:
        value = fields[FIELD_PAYLOAD]
        return value if isinstance(value, bytes) else str(value).encode("utf-8")
    rest = {k: _text(v) for k, v in fields.items() if k not in (FIELD_ID, FIELD_HEADERS)}
    return json.dumps(rest, separators=(",", ":")).encode("utf-8")
