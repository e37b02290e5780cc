# SPDX-License-Identifier: MIT
"""Amazon SQS as a :class:`~onceonly.brokers._loop.Transport` (through aiobotocore):
long-poll ReceiveMessage (up to 10), DeleteMessage to ack, ChangeMessageVisibility to
retry after a delay and to keep long handlers' messages invisible."""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from onceonly._core.window import Bound
from onceonly.brokers._transport import Incoming
from onceonly.brokers.sqs import _wire as wire
from onceonly.errors import BrokerUnavailable, ConfigurationError, PublishError

__all__ = ["SqsTransport"]


class SqsTransport:
    delays_retries = True  # ChangeMessageVisibility(delay)

    def __init__(
        self,
        *,
        session: Any,
        client_options: Mapping[str, Any],
        queue: str,
        dead_letter: str | None,
        create_dead_letter_queue: bool,
        visibility_timeout: int,
        wait_time: int,
        fallback: bool,
        max_deliveries: int,
        log: logging.Logger,
    ) -> None:
        self.session = session
        self.client_options = dict(client_options)
        self.queue = queue
        self.dead_letter_queue = dead_letter
        self.create_dead_letter_queue = create_dead_letter_queue
        self.visibility_timeout = visibility_timeout
        self.wait_time = wait_time
        self.fallback = fallback
        self.max_deliveries = max_deliveries
        self.log = log
        self.where = f"queue {queue}"
        self.extend_every: float | None = visibility_timeout / 3
        self.fifo = wire.is_fifo(queue)
        self._stack: contextlib.AsyncExitStack | None = None
        self.client: Any = None
        self._url = self._dead_url = ""
        self._attributes: dict[str, str] = {}

    async def open(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self.client = await self._stack.enter_async_context(
            self.session.create_client("sqs", **self.client_options)
        )
        try:
            self._url = (await self.client.get_queue_url(QueueName=self.queue))["QueueUrl"]
        except ClientError as exc:
            raise ConfigurationError(f"SQS has no queue {self.queue!r}: {exc}") from exc
        reply = await self.client.get_queue_attributes(QueueUrl=self._url, AttributeNames=["All"])
        self._attributes = reply.get("Attributes", {})
        redrive = json.loads(self._attributes.get("RedrivePolicy") or "{}")
        if redrive:
            target = str(redrive.get("deadLetterTargetArn", "")).rsplit(":", 1)[-1]
            if self.dead_letter_queue is None and target:
                self.dead_letter_queue = target  # dead letters go where SQS moves them
            limit = int(redrive.get("maxReceiveCount", 0) or 0)
            if limit and limit <= self.max_deliveries:
                self.log.warning(
                    "%s: its redrive policy moves a message after %d receives, before "
                    "max_deliveries (%d): such messages reach %s without onceonly's headers",
                    self.queue,
                    limit,
                    self.max_deliveries,
                    target,
                )
        if self.dead_letter_queue is None:
            base = self.queue[: -len(".fifo")] if self.fifo else self.queue
            self.dead_letter_queue = f"{base}-dead.fifo" if self.fifo else f"{base}-dead"
        self._dead_url = await self._dead_letter_url(self.dead_letter_queue)
        self.log.info("consuming %s (dead letters to %s)", self.queue, self.dead_letter_queue)

    async def _dead_letter_url(self, name: str) -> str:
        try:
            return str((await self.client.get_queue_url(QueueName=name))["QueueUrl"])
        except ClientError:
            if not self.create_dead_letter_queue:
                raise ConfigurationError(f"SQS has no dead-letter queue {name!r}") from None
        attributes = {"FifoQueue": "true"} if wire.is_fifo(name) else {}
        created = await self.client.create_queue(QueueName=name, Attributes=attributes)
        self.log.info("created the dead-letter queue %s", name)
        return str(created["QueueUrl"])

    async def bounds(self, redeliveries: Callable[[float, str], Bound]) -> list[Bound]:
        """The queue's retention period and the redeliveries' span."""
        out = [redeliveries(float(self.visibility_timeout), "visibility_timeout")]
        retention = self._attributes.get("MessageRetentionPeriod")
        if retention:
            out.append(Bound(f"queue {self.queue} MessageRetentionPeriod", float(retention)))
        return out

    async def receive(self, limit: int) -> Sequence[Incoming]:
        try:
            reply = await self.client.receive_message(
                QueueUrl=self._url,
                MaxNumberOfMessages=max(1, min(limit, 10)),
                WaitTimeSeconds=self.wait_time,
                VisibilityTimeout=self.visibility_timeout,
                AttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
        except (BotoCoreError, ClientError, OSError) as exc:
            raise BrokerUnavailable(f"receive from {self.queue} failed: {exc!r}") from exc
        return [self._incoming(m) for m in reply.get("Messages", [])]

    def _incoming(self, message: Mapping[str, Any]) -> Incoming:
        headers = wire.headers_of(message)
        mid = wire.broker_id(message, headers, self.fifo, self.fallback)
        return Incoming(
            broker_id=mid,
            body=str(message.get("Body", "")).encode("utf-8"),
            headers=headers,
            delivery_count=wire.delivery_count(message),
            source=self.queue,
            raw=message,
            label=mid or str(message.get("MessageId")),
        )

    async def widen(self) -> None:
        """Nothing to widen: ``receive`` pulls only what the loop asks for."""

    def wake(self) -> None:
        """Nothing to wake: a receive returns within ``wait_time``."""

    async def ack(self, d: Incoming) -> None:
        await self.client.delete_message(QueueUrl=self._url, ReceiptHandle=d.raw["ReceiptHandle"])

    async def retry(self, d: Incoming, delay: float) -> None:
        await self.client.change_message_visibility(
            QueueUrl=self._url,
            ReceiptHandle=d.raw["ReceiptHandle"],
            VisibilityTimeout=min(math.ceil(max(delay, 0.0)), 43_200),
        )

    async def dead_letter(
        self, d: Incoming, headers: dict[str, Any], message_id: str | None
    ) -> None:
        args: dict[str, Any] = {
            "QueueUrl": self._dead_url,
            "MessageBody": d.body.decode("utf-8", "replace") or " ",
            "MessageAttributes": wire.attributes(headers),
        }
        if wire.is_fifo(self.dead_letter_queue or ""):
            args["MessageGroupId"] = self.queue
            args["MessageDeduplicationId"] = str(d.raw.get("MessageId"))
        try:
            await self.client.send_message(**args)
        except (BotoCoreError, ClientError, OSError) as exc:
            raise PublishError(f"dead letter to {self.dead_letter_queue} failed: {exc!r}") from exc

    async def extend(self, ds: Sequence[Incoming]) -> None:
        for i in range(0, len(ds), 10):
            entries = [
                {
                    "Id": str(n),
                    "ReceiptHandle": d.raw["ReceiptHandle"],
                    "VisibilityTimeout": self.visibility_timeout,
                }
                for n, d in enumerate(ds[i : i + 10])
            ]
            await self.client.change_message_visibility_batch(QueueUrl=self._url, Entries=entries)

    async def stop_receiving(self) -> None:
        """Nothing to cancel: the loop stops asking."""

    async def close(self, graceful: bool) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            with contextlib.suppress(Exception):
                await stack.aclose()
        self.client = None
