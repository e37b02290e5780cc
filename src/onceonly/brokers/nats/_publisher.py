# SPDX-License-Identifier: MIT
"""The NATS JetStream outbox publisher (waits for each PubAck)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext

from onceonly._core.urls import redact_url
from onceonly.brokers.nats._wire import TRANSPORT_ERRORS, connect, outbound_headers
from onceonly.errors import BrokerUnavailable, ConfigurationError, PublishError
from onceonly.messaging import OutboxMessage

__all__ = ["NatsPublisher"]

log = logging.getLogger("onceonly.brokers.nats")


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
                    conn = await connect(self.url, self.connect_options, self.timeout)
                except TRANSPORT_ERRORS as exc:
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
        headers = outbound_headers(message)
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
        except TRANSPORT_ERRORS as exc:
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
