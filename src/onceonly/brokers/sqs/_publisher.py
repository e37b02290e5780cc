# SPDX-License-Identifier: MIT
"""The Amazon SQS outbox publisher (SendMessage; its reply is the confirmation)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from onceonly.brokers.sqs import _wire as wire
from onceonly.errors import BrokerUnavailable, PublishError
from onceonly.messaging import OutboxMessage

__all__ = ["SqsPublisher"]

#: Error codes that say SQS cannot take the message now, not that it refuses it.
_TRANSIENT = ("ThrottlingException", "RequestThrottled", "ServiceUnavailable", "InternalError")


class SqsPublisher:
    """Publishes outbox messages to SQS queues named ``queue_prefix + message.topic``.

    Args:
        session: an ``aiobotocore.session.AioSession`` (default: a new one).
        queue_prefix: prepended to ``message.topic`` to form the queue name.
        timeout: seconds to wait for the SendMessage reply.
        **client_options: for ``session.create_client("sqs", ...)`` (``region_name``,
            ``endpoint_url``, credentials).

    The outbox id travels as the ``onceonly-message-id`` attribute (and as the
    deduplication id on a FIFO queue, whose message group is the key, else the topic).

    .. versionadded:: 0.3
    """

    def __init__(
        self,
        *,
        session: Any = None,
        queue_prefix: str = "",
        timeout: float = 10.0,
        **client_options: Any,
    ) -> None:
        if session is None:
            from aiobotocore.session import get_session

            session = get_session()
        self.session = session
        self.queue_prefix = queue_prefix
        self.timeout = timeout
        self.client_options: Mapping[str, Any] = client_options
        self._stack: contextlib.AsyncExitStack | None = None
        self._client: Any = None
        self._urls: dict[str, str] = {}
        self._lock = asyncio.Lock()

    async def _ready(self) -> Any:
        async with self._lock:
            if self._client is None:
                self._stack = contextlib.AsyncExitStack()
                self._client = await self._stack.enter_async_context(
                    self.session.create_client("sqs", **self.client_options)
                )
            return self._client

    async def connect(self) -> None:
        """Check SQS answers now (a relay does at start-up)."""
        client = await self._ready()
        try:
            await asyncio.wait_for(client.list_queues(MaxResults=1), self.timeout)
        except (BotoCoreError, ClientError, OSError, asyncio.TimeoutError) as exc:
            raise BrokerUnavailable(f"cannot reach SQS: {exc!r}") from exc

    async def publish(self, message: OutboxMessage) -> None:
        """SendMessage to the topic's queue; return once SQS replied with its id.

        Raises:
            PublishError: no such queue, or SQS refused the message.
            BrokerUnavailable: no reply within ``timeout``, throttled, or unreachable.
        """
        queue = f"{self.queue_prefix}{message.topic}"
        client = await self._ready()
        try:
            url = self._urls.get(queue)
            if url is None:
                url = self._urls[queue] = (await client.get_queue_url(QueueName=queue))["QueueUrl"]
            reply = await asyncio.wait_for(
                client.send_message(QueueUrl=url, **wire.outbound(message, queue)), self.timeout
            )
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            kind = BrokerUnavailable if code in _TRANSIENT else PublishError
            raise kind(f"SQS refused the message on {queue!r}: {exc}", key=message.id) from exc
        except (BotoCoreError, OSError, asyncio.TimeoutError) as exc:
            raise BrokerUnavailable(
                f"SQS did not confirm on {queue!r}: {exc!r}", key=message.id
            ) from exc
        if not reply.get("MessageId"):
            raise PublishError(f"SQS did not confirm the message on {queue!r}", key=message.id)

    async def close(self) -> None:
        async with self._lock:
            stack, self._stack, self._client = self._stack, None, None
            if stack is not None:
                with contextlib.suppress(Exception):
                    await stack.aclose()

    async def __aenter__(self) -> SqsPublisher:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
