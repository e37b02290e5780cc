# SPDX-License-Identifier: MIT
"""The messaging contract shared by the outbox relay, the publishers and the consumers.

* :class:`OutboxMessage` is a row of the outbox as the relay hands it to a publisher.
  Its ``id`` (a UUIDv7 fixed when the row was inserted) is the message id the broker
  carries, so a consumer's inbox deduplicates a message the relay published twice.
* A publisher's ``publish`` returns only after the broker confirmed the message
  (publisher confirms with mandatory routing, JetStream PubAck, the XADD reply) and
  raises :class:`~onceonly.PublishError` otherwise.
* :class:`Delivery` describes one delivery to a consumer; handlers find it at
  ``tx.delivery``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["AsyncPublisher", "Delivery", "OutboxMessage", "Publisher"]

#: Header names onceonly sets on what it publishes and dead-letters.
HEADER_MESSAGE_ID = "onceonly-message-id"
HEADER_KEY = "onceonly-key"
HEADER_ERROR = "onceonly-error"
HEADER_ATTEMPTS = "onceonly-attempts"
HEADER_REASON = "onceonly-dead-reason"


@dataclass(frozen=True)
class OutboxMessage:
    """One outbox row.

    Attributes:
        id: the message id (UUIDv7), fixed at insert; travels with the message for ever.
        topic: where to publish (a routing key, subject or stream name).
        payload: the JSON text of the payload.
        key: the ordering key, if any.
        headers: string headers to send along.
        attempts: failed publish attempts so far.
    """

    id: str
    topic: str
    payload: str
    key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    attempts: int = 0
    created_at: float = 0.0

    @property
    def body(self) -> bytes:
        """The payload as UTF-8 JSON bytes."""
        return self.payload.encode("utf-8")

    def decoded(self) -> Any:
        """The payload decoded from JSON."""
        return json.loads(self.payload)


class AsyncPublisher(Protocol):
    """Publishes outbox messages to a broker, waiting for its confirmation."""

    async def publish(self, message: OutboxMessage) -> None:
        """Publish ``message`` with ``message.id`` as its id; return once confirmed.

        Raises:
            PublishError: refused, unroutable, not confirmed, or the connection failed.
        """

    async def close(self) -> None:
        """Release the broker connection."""


class Publisher(Protocol):
    """The sync form of :class:`AsyncPublisher`."""

    def publish(self, message: OutboxMessage) -> None:
        """Publish ``message`` with ``message.id`` as its id; return once confirmed.

        Raises:
            PublishError: refused, unroutable, not confirmed, or the connection failed.
        """

    def close(self) -> None:
        """Release the broker connection."""


@dataclass(frozen=True)
class Delivery:
    """One delivery of a broker message to a consumer (``tx.delivery`` in handlers).

    Attributes:
        message_id: the id the inbox deduplicates on.
        source: the queue, subject or stream it came from.
        delivery_count: how many times the broker has delivered it (1 = first), when
            the broker tells.
        redelivered: the broker's redelivery flag.
        headers: the message headers.
        raw: the broker client's message object.
    """

    message_id: str
    source: str
    delivery_count: int | None = None
    redelivered: bool = False
    headers: Mapping[str, Any] = field(default_factory=dict)
    raw: Any = None
