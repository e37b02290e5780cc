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

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

try:
    import nats
    import nats.errors
    import nats.js.errors
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.js import JetStreamContext, api
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "onceonly.brokers.nats needs the nats extra: pip install 'onceonly[nats]'"
    ) from exc

from onceonly._core.settle import Action, Backoff, header_text
from onceonly._core.urls import redact_url
from onceonly._core.window import Bound
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

__all__ = ["NatsConsumer", "NatsPublisher"]

log = logging.getLogger("onceonly.brokers.nats")

#: JetStream's message-id header (deduplication within the stream's duplicate window).
MSG_ID_HEADER = "Nats-Msg-Id"
#: Where a dead-lettered message was consumed from (its subject).
HEADER_SOURCE = "onceonly-source"

_TRANSPORT_ERRORS = (nats.errors.Error, asyncio.TimeoutError, OSError)
_MAX_HEADER_VALUE = 1024


async def _log_error(exc: Exception) -> None:
    log.warning("nats connection error: %r", exc)


async def _connect(url: str, options: Mapping[str, Any], timeout: float) -> Client:
    """Open a connection, bounded by ``timeout`` (nats-py may retry for a long time)."""
    client = Client()
    opts: dict[str, Any] = {"error_cb": _log_error, "name": "onceonly", **options}
    try:
        await asyncio.wait_for(client.connect(url, **opts), timeout)
    except BaseException:
        with contextlib.suppress(Exception):
            await client.close()
        raise
    return client


def _header_value(text: str) -> str:
    """A header value: one line (CR/LF would break the protocol), no NUL or lone
    surrogates, bounded in length."""
    return header_text(text, _MAX_HEADER_VALUE)


def _ascii_header_value(text: str) -> str:
    """:func:`_header_value`, with non-ASCII characters escaped (``\\xe9``): header
    values are MIME-like, and readers that parse them as such (nats-py's ``get_msg``)
    turn 8-bit values into ``email.header.Header`` objects."""
    safe = _header_value(text).encode("ascii", "backslashreplace").decode("ascii")
    return safe if len(safe) <= _MAX_HEADER_VALUE else safe[: _MAX_HEADER_VALUE - 3] + "..."


def _subject_matches(pattern: str, subject: str) -> bool:
    """Whether the NATS ``subject`` matches ``pattern`` (``*`` one token, ``>`` the rest)."""
    p_tokens, s_tokens = pattern.split("."), subject.split(".")
    for i, token in enumerate(p_tokens):
        if token == ">":
            return len(s_tokens) > i
        if i >= len(s_tokens) or (token != "*" and token != s_tokens[i]):
            return False
    return len(p_tokens) == len(s_tokens)


def _is_literal(subject: str) -> bool:
    return bool(subject) and not any(t in ("*", ">") for t in subject.split("."))


class NatsPublisher:
    """Publishes outbox messages to NATS JetStream and waits for the stream's PubAck.

    Args:
        url: a NATS URL (``nats://127.0.0.1:4222``); the publisher opens and owns the
            connection, and reopens it on the next publish after it was closed.
        connection: a nats-py client to use instead (not closed by ``close``).
        subject_prefix: prepended to ``message.topic`` to form the subject, e.g.
            ``"events."`` publishes topic ``orders`` to ``events.orders``.
        stream: when set, the stream expected to store the message
            (``Nats-Expected-Stream``); any other stream refuses it.
        timeout: seconds to wait for the PubAck (and for a connection).
        connect_options: keyword options for ``nats.connect`` (credentials, TLS, …).

    Safe to call ``publish`` concurrently: requests are multiplexed on one connection.

    .. versionadded:: 0.1
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        connection: Client | None = None,
        subject_prefix: str = "",
        stream: str | None = None,
        timeout: float = 5.0,
        connect_options: Mapping[str, Any] | None = None,
    ) -> None:
        if (url is None) == (connection is None):
            raise ConfigurationError("pass exactly one of url= or connection=")
        if timeout <= 0:
            raise ConfigurationError("timeout must be positive")
        self.url = url
        self.subject_prefix = subject_prefix
        self.stream = stream
        self.timeout = timeout
        self.connect_options: dict[str, Any] = {
            # fail fast; the relay retries and the next publish reconnects
            "max_reconnect_attempts": 1,
            "connect_timeout": max(1, int(timeout)),
            **(connect_options or {}),
        }
        self._connection = connection
        self._owns_connection = connection is None
        self._js: JetStreamContext | None = None
        self._lock = asyncio.Lock()

    def subject_for(self, topic: str) -> str:
        """The subject a message of ``topic`` is published to."""
        return f"{self.subject_prefix}{topic}"

    async def _ready(self, message_id: str | None) -> JetStreamContext:
        conn = self._connection
        if conn is not None and not conn.is_closed and self._js is not None:
            return self._js
        async with self._lock:
            conn = self._connection
            if conn is None or conn.is_closed:
                if not self._owns_connection:
                    raise PublishError(
                        "the NATS connection handed to the publisher is closed",
                        key=message_id,
                    )
                assert self.url is not None
                try:
                    conn = await _connect(self.url, self.connect_options, self.timeout)
                except _TRANSPORT_ERRORS as exc:
                    raise BrokerUnavailable(
                        f"cannot connect to NATS at {redact_url(self.url)}: {exc!r}", key=message_id
                    ) from exc
                self._connection = conn
                self._js = None
            if self._js is None:
                self._js = conn.jetstream(timeout=self.timeout)
            return self._js

    async def connect(self) -> None:
        """Connect now (a relay does at start-up: a wrong URL stops it at once).

        Raises:
            BrokerUnavailable: NATS cannot be reached.

        .. versionadded:: 0.2
        """
        await self._ready(None)

    async def _no_stream_for(self, js: JetStreamContext, subject: str) -> bool:
        """Whether JetStream answers that no stream captures ``subject`` (False when it
        does not answer at all)."""
        try:
            await js.find_stream_name_by_subject(subject)
        except nats.js.errors.NotFoundError:
            return True
        except Exception:
            return False
        return False

    async def publish(self, message: OutboxMessage) -> None:
        """Publish ``message`` with ``message.id`` as ``Nats-Msg-Id``; return once stored.

        Args:
            message: the outbox message; ``headers`` are sent along, plus
                ``onceonly-key`` when ``message.key`` is set.

        Raises:
            PublishError: no stream captures the subject, JetStream refused it, or it is
                larger than the server's ``max_payload``.
            BrokerUnavailable: no PubAck within ``timeout``, or the connection failed
                (transient).
        """
        js = await self._ready(message.id)
        subject = self.subject_for(message.topic)
        headers: dict[str, str] = dict(message.headers)
        headers[MSG_ID_HEADER] = message.id
        headers["Content-Type"] = "application/json"
        if message.key is not None:
            headers[HEADER_KEY] = message.key
        try:
            ack = await js.publish(
                subject, message.body, timeout=self.timeout, stream=self.stream, headers=headers
            )
        except nats.js.errors.NoStreamResponseError as exc:
            # no stream answered: none captures the subject (permanent), or JetStream is
            # not up yet (a restarting server: transient); ask which
            if await self._no_stream_for(js, subject):
                raise PublishError(
                    f"no JetStream stream captures subject {subject!r}", key=message.id
                ) from exc
            raise BrokerUnavailable(
                f"JetStream did not answer for {subject!r} (not ready?)", key=message.id
            ) from exc
        except nats.js.errors.APIError as exc:
            raise PublishError(
                f"JetStream refused the message on {subject!r}: {exc}", key=message.id
            ) from exc
        except nats.errors.MaxPayloadError as exc:
            raise PublishError(
                f"the message on {subject!r} is larger than the server's max_payload",
                key=message.id,
            ) from exc
        except _TRANSPORT_ERRORS as exc:
            raise BrokerUnavailable(
                f"the message on {subject!r} was not confirmed: {exc!r}", key=message.id
            ) from exc
        log.debug(
            "published %s to %s (stream %s seq %s%s)",
            message.id,
            subject,
            ack.stream,
            ack.seq,
            ", duplicate" if ack.duplicate else "",
        )

    async def close(self) -> None:
        """Close the connection if the publisher opened it."""
        conn, self._connection, self._js = self._connection, None, None
        if self._owns_connection and conn is not None and not conn.is_closed:
            with contextlib.suppress(Exception):
                await conn.close()
        if not self._owns_connection:
            self._connection = conn

    async def __aenter__(self) -> NatsPublisher:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class NatsConsumer:
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
        message_id: a :class:`MessageIds`, or its fallback when a message carries no
            ``Nats-Msg-Id``: ``None``, ``"content"``, a payload field name or a callable.
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

    .. versionadded:: 0.1
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
    ) -> None:
        if (url is None) == (connection is None):
            raise ConfigurationError("pass exactly one of url= or connection=")
        if not stream or not subject or not durable:
            raise ConfigurationError("stream, subject and durable must be non-empty")
        if batch < 1:
            raise ConfigurationError("batch must be at least 1")
        if ack_wait <= 0 or poll_timeout <= 0 or publish_timeout <= 0:
            raise ConfigurationError("ack_wait, poll_timeout and publish_timeout must be > 0")
        dead = dead_letter or (f"{subject}.dead" if _is_literal(subject) else f"{stream}.dead")
        if not _is_literal(dead):
            raise ConfigurationError(f"dead_letter must be a literal subject, not {dead!r}")
        if _subject_matches(subject, dead):
            raise ConfigurationError(
                f"the dead-letter subject {dead!r} matches the consumer's subject {subject!r}: "
                "dead letters would come back; pass another dead_letter="
            )
        self.inbox = inbox
        self.handler = handler
        self.stream = stream
        self.subject = subject
        self.durable = durable
        self.url = url
        self.ack_wait = ack_wait
        self.batch = batch
        self.concurrency = concurrency or batch
        self.ids = message_id if isinstance(message_id, MessageIds) else MessageIds(message_id)
        self.dead_letter = dead
        self.create_dead_letter_stream = create_dead_letter_stream
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
        self.poll_timeout = poll_timeout
        self.publish_timeout = publish_timeout
        self.shutdown_timeout = shutdown_timeout
        self.connect_options: dict[str, Any] = {
            "max_reconnect_attempts": -1,
            **(connect_options or {}),
        }
        self._tracker = InFlightTracker(self.concurrency)
        self._free = self.concurrency
        self._slot_freed = asyncio.Event()
        self._connection = connection
        self._owns_connection = connection is None
        self._js: JetStreamContext | None = None
        self._sub: JetStreamContext.PullSubscription | None = None
        self._heartbeat = ack_wait / 3
        self._stop: asyncio.Event | None = None
        self._done: asyncio.Event | None = None
        self._started = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------

    async def run(self) -> None:
        """Consume until :meth:`stop` is called or the task is cancelled.

        A cancellation does not wait: running handlers are cancelled, their
        transactions roll back and their messages are nak'ed for redelivery.

        Raises:
            ConfigurationError: the stream does not exist, the durable is not an
                explicit-ack pull consumer, or the dead-letter stream cannot be made.
            nats.errors.Error, OSError, asyncio.TimeoutError: NATS is unreachable.
        """
        if self._done is not None:
            raise RuntimeError("this consumer is already running")
        self._done = asyncio.Event()
        self._stop = asyncio.Event()
        graceful = False
        try:
            await self._start()
            self._started.set()
            await self._consume(self._stop)
            graceful = True
        finally:
            try:
                await self._shutdown(self.shutdown_timeout if graceful else 0.0)
            finally:
                done, self._done, self._stop = self._done, None, None
                self._started = asyncio.Event()
                done.set()

    async def stop(self) -> None:
        """Stop fetching, let running handlers finish and settle, then close.

        Returns once the shutdown is over (at most about ``poll_timeout`` +
        ``shutdown_timeout``).
        """
        done, stop = self._done, self._stop
        if done is None or stop is None:
            return
        stop.set()
        await done.wait()

    async def __aenter__(self) -> NatsConsumer:
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
            await task

    async def _start(self) -> None:
        if self._connection is None or self._connection.is_closed:
            if not self._owns_connection:
                raise nats.errors.ConnectionClosedError
            assert self.url is not None
            self._connection = await _connect(
                self.url, self.connect_options, max(self.publish_timeout, 5.0)
            )
        js = self._connection.jetstream(timeout=self.publish_timeout)
        self._js = js
        config = api.ConsumerConfig(
            durable_name=self.durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait,
            max_deliver=-1,
            filter_subject=self.subject,
        )
        try:
            sub = await js.pull_subscribe(
                self.subject, durable=self.durable, stream=self.stream, config=config
            )
        except nats.js.errors.NotFoundError as exc:
            raise ConfigurationError(f"JetStream has no stream {self.stream!r}") from exc
        except nats.js.errors.BadRequestError as exc:
            raise ConfigurationError(
                f"cannot create the durable consumer {self.durable!r} on {self.stream!r}: {exc}"
            ) from exc
        self._sub = sub
        info = await sub.consumer_info()
        existing = info.config
        if existing.ack_policy not in (None, api.AckPolicy.EXPLICIT):
            raise ConfigurationError(
                f"the durable consumer {self.durable!r} has ack_policy {existing.ack_policy}; "
                "it must be explicit"
            )
        if existing.filter_subject and existing.filter_subject != self.subject:
            log.warning(
                "durable %s filters %s, not %s; consuming what it filters",
                self.durable,
                existing.filter_subject,
                self.subject,
            )
        if existing.ack_wait:
            self._heartbeat = float(existing.ack_wait) / 3
        await self._check_window(js, existing)
        await self._ensure_dead_letter_stream(js)
        log.info(
            "consuming %s from stream %s as %s (dead letters to %s)",
            self.subject,
            self.stream,
            self.durable,
            self.dead_letter,
        )

    async def _check_window(self, js: JetStreamContext, config: api.ConsumerConfig) -> None:
        """The inbox ttl against the stream's max_age and the redeliveries' span."""
        bounds = []
        stream = await js.stream_info(self.stream)
        if stream.config.max_age:
            bounds.append(Bound(f"stream {self.stream} max_age", float(stream.config.max_age)))
        bound = self._deliveries.redeliveries_bound(float(config.ack_wait or 0), "ack_wait")
        if config.max_deliver and config.max_deliver > 0:
            each = bound.seconds / self.max_deliveries
            bound = Bound(
                "max_deliver x ack_wait", min(config.max_deliver, self.max_deliveries) * each
            )
        bounds.append(bound)
        self._deliveries.check_window(bounds, f"durable {self.durable} on {self.stream}")

    async def _ensure_dead_letter_stream(self, js: JetStreamContext) -> None:
        try:
            await js.find_stream_name_by_subject(self.dead_letter)
            return
        except nats.js.errors.NotFoundError:
            if not self.create_dead_letter_stream:
                raise ConfigurationError(
                    f"no stream captures the dead-letter subject {self.dead_letter!r}"
                ) from None
        name = f"{self.stream}_dead"
        try:
            await js.add_stream(name=name, subjects=[self.dead_letter])
        except nats.js.errors.APIError as exc:
            raise ConfigurationError(
                f"cannot create the dead-letter stream {name!r} for {self.dead_letter!r}: {exc}"
            ) from exc
        log.info("created stream %s for the dead-letter subject %s", name, self.dead_letter)

    async def _shutdown(self, timeout: float) -> None:
        # Unsubscribe first: a pull request still waiting on the server (a cancelled
        # fetch) would otherwise capture the messages the handlers nak below.
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        await self._tracker.drain(timeout)
        conn, self._js = self._connection, None
        if conn is not None and not conn.is_closed:
            with contextlib.suppress(Exception):
                await conn.flush(timeout=max(1, int(self.publish_timeout)))  # the last acks
            if self._owns_connection:
                with contextlib.suppress(Exception):
                    await conn.close()
        if self._owns_connection:
            self._connection = None
        log.info("stopped consuming %s from stream %s", self.subject, self.stream)

    # -- fetching --------------------------------------------------------------------

    async def _wait_for(self, stop: asyncio.Event, event: asyncio.Event, timeout: float) -> None:
        """Wait until ``event`` or ``stop`` is set, or ``timeout`` passes."""
        waits = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(event.wait())}
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _consume(self, stop: asyncio.Event) -> None:
        sub = self._sub
        assert sub is not None
        errors = 0
        while not stop.is_set():
            if self._free <= 0:
                self._slot_freed.clear()
                await self._wait_for(stop, self._slot_freed, self.poll_timeout)
                continue
            want = min(self.batch, self._free)
            try:
                msgs = await sub.fetch(want, timeout=self.poll_timeout)
                errors = 0
            except asyncio.TimeoutError:  # nats.errors.TimeoutError: nothing to fetch
                continue
            except (nats.errors.Error, OSError, ValueError) as exc:
                conn = self._connection
                if conn is None or conn.is_closed:
                    raise  # a connection we may not reopen (or gave up on): end run()
                errors += 1
                delay = min(0.1 * 2 ** min(errors, 10), self.max_backoff)
                log.warning(
                    "fetch from %s failed (%r); retrying in %.1fs", self.durable, exc, delay
                )
                await self._wait_for(stop, asyncio.Event(), delay)
                continue
            for msg in msgs:
                # nats-py's fetch() also hands over what was already queued (pull requests
                # answered together after a reconnect), so it may return more than asked:
                # give back what exceeds the free handler slots.
                if stop.is_set() or self._free <= 0:
                    await self._release(msg, "stopping" if stop.is_set() else "no free slot")
                    continue
                self._free -= 1
                self._tracker.spawn(self._handle(msg))

    async def _release(self, msg: Msg, why: str) -> None:
        """Hand a fetched message back at once (nak without delay)."""
        try:
            await msg.nak()
        except Exception as exc:
            log.debug("%s: could not nak (%s): %r", _label(msg), why, exc)
        else:
            log.debug("%s: nak'ed (%s)", _label(msg), why)

    # -- one message -----------------------------------------------------------------

    async def _handle(self, msg: Msg) -> None:
        try:
            await self._process(msg)
        except asyncio.CancelledError:
            # shutdown could not wait: the transaction rolled back; hand the message back
            await self._release(msg, "cancelled")
            raise
        except Exception:
            log.exception("%s: unexpected error; left for redelivery", _label(msg))
            with contextlib.suppress(Exception):
                await msg.nak(delay=self.max_backoff)
        finally:
            self._free += 1
            self._slot_freed.set()

    async def _keepalive(self, msg: Msg, label: str) -> None:
        """Tell JetStream the message is in progress, so ``ack_wait`` restarts."""
        while True:
            await asyncio.sleep(self._heartbeat)
            try:
                await msg.in_progress()
            except Exception as exc:
                log.debug("%s: in-progress signal failed: %r", label, exc)
            else:
                log.debug("%s: still in progress", label)

    async def _process(self, msg: Msg) -> None:
        meta = msg.metadata
        headers: dict[str, str] = dict(msg.headers or {})
        broker_id = headers.get(MSG_ID_HEADER) or None
        label = _label(msg)
        count = meta.num_delivered

        def delivery(message_id: str) -> Delivery:
            return Delivery(
                message_id=message_id,
                source=msg.subject,
                delivery_count=count,
                redelivered=count > 1,
                headers=headers,
                raw=msg,
            )

        keepalive = asyncio.ensure_future(self._keepalive(msg, label))
        try:
            try:
                settlement = await self._deliveries.process(
                    broker_id=broker_id,
                    decode=lambda: decode_body(msg.data),
                    delivery=delivery,
                    delivery_count=count,
                    stop=self._stop,
                    label=label,
                )
            except Exception as exc:  # a bug of ours: still settle the message
                log.exception("%s: unexpected error", label)
                settlement = unexpected(exc, self._deliveries.delay(count))
        finally:
            keepalive.cancel()
        label = settlement.message_id or label
        v = settlement.verdict
        if v.action is Action.ACK:
            await msg.ack()
            if v.reason:
                log.warning("%s: acked (%s: %s)", label, v.reason, v.error)
            else:
                log.debug("%s: acked%s", label, " (replayed)" if settlement.replayed else "")
        elif v.action is Action.RETRY:
            # counted: nak with the backoff (JetStream counts the redelivery); uncounted:
            # only when stopping, so hand it back at once
            delay = v.delay if v.counted else 0.0
            await msg.nak(delay=delay)
            log.info(
                "%s: nak'ed (%s), redelivery in %.2fs (delivery %d)",
                label,
                v.reason,
                delay,
                count,
            )
        elif await self._dead_letter(msg, settlement, label):
            await msg.ack()
            log.warning(
                "%s: dead-lettered to %s (%s) and acked",
                label,
                self.dead_letter,
                v.reason,
            )
        else:
            await msg.nak(delay=self._deliveries.delay(count))

    async def _dead_letter(self, msg: Msg, settlement: Settlement, label: str) -> bool:
        """Publish ``msg`` to the dead-letter subject and wait for its PubAck."""
        js = self._js
        if js is None:
            return False
        meta = msg.metadata
        headers = {k: v for k, v in (msg.headers or {}).items() if not k.startswith("Nats-")}
        v, message_id = settlement.verdict, settlement.message_id
        headers[HEADER_REASON] = v.reason or "dead"
        headers[HEADER_ERROR] = _ascii_header_value(v.error or v.reason or "dead")
        headers[HEADER_ATTEMPTS] = str(v.attempts or 0)
        headers[HEADER_SOURCE] = msg.subject
        if message_id:
            headers[HEADER_MESSAGE_ID] = _header_value(message_id)
        # one dead-letter copy per stream message, however often it is redelivered
        headers[MSG_ID_HEADER] = f"{self.durable}:{meta.stream}:{meta.sequence.stream}"
        try:
            await js.publish(
                self.dead_letter, msg.data, timeout=self.publish_timeout, headers=headers
            )
        except (nats.js.errors.Error, *_TRANSPORT_ERRORS) as exc:
            log.error(
                "%s: dead-letter publish to %s failed (%r); left for redelivery",
                label,
                self.dead_letter,
                exc,
            )
            return False
        return True


def _label(msg: Msg) -> str:
    """The message id for log lines: the ``Nats-Msg-Id``, else stream and sequence."""
    msg_id = (msg.headers or {}).get(MSG_ID_HEADER)
    if msg_id:
        return str(msg_id)
    try:
        meta = msg.metadata
        return f"{meta.stream}#{meta.sequence.stream}"
    except Exception:
        return msg.subject
