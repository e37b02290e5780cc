# SPDX-License-Identifier: MIT
"""RabbitMQ's wire format: what a message carries, one place for the publisher, the
consumer and the dead letters (ids, headers, delivery counts, confirmed publishes)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractExchange, AbstractIncomingMessage

from onceonly.errors import BrokerUnavailable, PublishError
from onceonly.messaging import HEADER_KEY, OutboxMessage

__all__ = [
    "DELIVERY_COUNT",
    "JSON",
    "dead_letter_message",
    "delivery_count",
    "outbound",
    "publish_confirmed",
    "translate",
]

JSON = "application/json"
#: A quorum queue's count of earlier deliveries (absent on the first).
DELIVERY_COUNT = "x-delivery-count"


def outbound(message: OutboxMessage, *, persistent: bool) -> aio_pika.Message:
    """The AMQP message of an outbox row: its id as ``message_id``, its key as the
    ``onceonly-key`` header."""
    headers: dict[str, Any] = dict(message.headers)
    if message.key:
        headers[HEADER_KEY] = message.key
    return aio_pika.Message(
        message.body,
        message_id=message.id,
        headers=headers,
        content_type=JSON,
        delivery_mode=(
            aio_pika.DeliveryMode.PERSISTENT if persistent else aio_pika.DeliveryMode.NOT_PERSISTENT
        ),
    )


def delivery_count(message: AbstractIncomingMessage, quorum: bool) -> int | None:
    """Quorum queues count earlier deliveries in ``x-delivery-count``; classic queues
    count nothing (``None``)."""
    header = (message.headers or {}).get(DELIVERY_COUNT)
    if isinstance(header, int) and not isinstance(header, bool):
        return header + 1
    return 1 if quorum else None


def drop(name: str) -> bool:
    """Headers a dead letter does not inherit: the broker's count (a redrive must start
    counting afresh)."""
    return name == DELIVERY_COUNT


def dead_letter_message(
    message: AbstractIncomingMessage, headers: dict[str, Any], message_id: str | None
) -> aio_pika.Message:
    """The original body and properties with the dead-letter ``headers``.

    A message that carried no id keeps none of its own; aiormq then gives the copy a
    random AMQP ``message_id`` (it matches broker returns by it).
    """
    return aio_pika.Message(
        message.body,
        headers=headers,
        content_type=message.content_type or JSON,
        content_encoding=message.content_encoding,
        message_id=message.message_id or message_id,
        correlation_id=message.correlation_id,
        timestamp=message.timestamp,
        type=message.type,
        app_id=message.app_id,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )


@contextlib.contextmanager
def translate(message_id: str | None, where: str) -> Iterator[None]:
    """Map every aio-pika/aiormq failure of one publish to :class:`PublishError`."""
    try:
        yield
    except aiormq.exceptions.PublishError as exc:
        raise PublishError(f"unroutable: {where} has no queue bound", key=message_id) from exc
    except aiormq.exceptions.DeliveryError as exc:
        raise PublishError(
            f"the broker refused the message (nack) on {where}", key=message_id
        ) from exc
    except aiormq.exceptions.ChannelNotFoundEntity as exc:
        raise PublishError(f"{where}: not found ({exc})", key=message_id) from exc
    except (TimeoutError, asyncio.TimeoutError) as exc:  # distinct classes on 3.10
        raise BrokerUnavailable(f"{where} did not confirm in time", key=message_id) from exc
    except (
        aiormq.exceptions.AMQPConnectionError,
        aiormq.exceptions.ChannelInvalidStateError,
        aiormq.exceptions.InvalidFrameError,  # e.g. the server closed the login (vhost)
        ConnectionError,
        OSError,
        RuntimeError,
    ) as exc:
        # the broker is unreachable or the connection went away: transient
        raise BrokerUnavailable(
            f"connection to the broker failed: {exc!r}", key=message_id
        ) from exc
    except aiormq.exceptions.AMQPError as exc:  # a channel-level refusal of this message
        raise PublishError(
            f"the broker refused the message on {where}: {exc!r}", key=message_id
        ) from exc


async def publish_confirmed(
    exchange: AbstractExchange, message: aio_pika.Message, routing_key: str, timeout: float
) -> None:
    """Publish mandatory on a confirming channel; raise PublishError unless confirmed."""
    where = f"exchange {exchange.name!r} routing key {routing_key!r}"
    with translate(message.message_id, where):
        result = await exchange.publish(message, routing_key, mandatory=True, timeout=timeout)
    if isinstance(result, aiormq.abc.DeliveredMessage):  # returned, on_return_raises=False
        raise PublishError(f"unroutable: {where} has no queue bound", key=message.message_id)
    if not isinstance(result, aiormq.spec.Basic.Ack):
        raise PublishError(f"{where} did not confirm the message", key=message.message_id)
