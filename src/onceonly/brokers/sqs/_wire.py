# SPDX-License-Identifier: MIT
"""Amazon SQS's wire format: headers as message attributes, the message id and the
delivery count (one place for the publisher, the consumer and the dead letters)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from onceonly.messaging import HEADER_KEY, HEADER_MESSAGE_ID, OutboxMessage

__all__ = [
    "MAX_ATTRIBUTES",
    "attributes",
    "broker_id",
    "delivery_count",
    "headers_of",
    "is_fifo",
    "outbound",
]

#: SQS carries at most 10 message attributes per message.
MAX_ATTRIBUTES = 10


def is_fifo(queue: str) -> bool:
    return queue.endswith(".fifo")


def attributes(headers: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """String headers as SQS message attributes (the first :data:`MAX_ATTRIBUTES`,
    ``onceonly-*`` first: SQS refuses more)."""
    ordered = sorted(headers.items(), key=lambda kv: (not str(kv[0]).startswith("onceonly-"),))
    return {
        str(k): {"DataType": "String", "StringValue": str(v) or " "}
        for k, v in ordered[:MAX_ATTRIBUTES]
    }


def headers_of(message: Mapping[str, Any]) -> dict[str, str]:
    """A received message's string attributes as headers."""
    out: dict[str, str] = {}
    for name, value in (message.get("MessageAttributes") or {}).items():
        if "StringValue" in value:
            out[name] = value["StringValue"]
    return out


def outbound(message: OutboxMessage, queue: str) -> dict[str, Any]:
    """``send_message`` arguments for an outbox row: its id as the ``onceonly-message-id``
    attribute (and, on a FIFO queue, as the deduplication id; the key, else the topic,
    is the message group)."""
    headers = dict(message.headers)
    headers[HEADER_MESSAGE_ID] = message.id
    if message.key is not None:
        headers[HEADER_KEY] = message.key
    args: dict[str, Any] = {
        "MessageBody": message.payload,
        "MessageAttributes": attributes(headers),
    }
    if is_fifo(queue):
        args["MessageDeduplicationId"] = message.id
        args["MessageGroupId"] = message.key or message.topic
    return args


def broker_id(
    message: Mapping[str, Any], headers: Mapping[str, str], fifo: bool, fallback: bool
) -> str | None:
    """The message id: the ``onceonly-message-id`` attribute (the outbox id, the same on
    every re-publish), else on a FIFO queue the deduplication id, else (unless the
    consumer has a ``message_id=`` fallback) SQS's ``MessageId``, which is the same on
    SQS's own redeliveries but new on each send."""
    if headers.get(HEADER_MESSAGE_ID):
        return headers[HEADER_MESSAGE_ID]
    if fifo:
        dedup = (message.get("Attributes") or {}).get("MessageDeduplicationId")
        if dedup:
            return str(dedup)
    if fallback:
        return None
    mid = message.get("MessageId")
    return str(mid) if mid else None


def delivery_count(message: Mapping[str, Any]) -> int:
    """``ApproximateReceiveCount`` (1 = the first receive)."""
    try:
        return int((message.get("Attributes") or {}).get("ApproximateReceiveCount", 1))
    except (TypeError, ValueError):
        return 1
