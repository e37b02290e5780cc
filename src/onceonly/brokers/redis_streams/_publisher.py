# SPDX-License-Identifier: MIT
"""The Redis Streams outbox publisher (XADD; its reply is the confirmation)."""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Any

import redis.asyncio
from redis.exceptions import RedisError, ResponseError

from onceonly.brokers.redis_streams._wire import client, outbound_fields, text, transient_reply
from onceonly.errors import BrokerUnavailable, ConfigurationError, PublishError
from onceonly.messaging import OutboxMessage

__all__ = ["RedisStreamsPublisher"]

log = logging.getLogger("onceonly.brokers.redis_streams")


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
        self._client: redis.asyncio.Redis = client(url, connection, options)
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
        fields = outbound_fields(message)
        try:
            entry_id = await asyncio.wait_for(
                self._client.xadd(stream, fields, maxlen=self.maxlen, approximate=True),  # type: ignore[arg-type]
                self.timeout,
            )
        except ResponseError as exc:
            kind = BrokerUnavailable if transient_reply(exc) else PublishError
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
        log.debug("%s: published to %s as %s", message.id, stream, text(entry_id))

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
