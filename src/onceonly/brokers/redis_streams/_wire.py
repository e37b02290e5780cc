# SPDX-License-Identifier: MIT
"""Redis Streams' wire format: an entry's fields, message ids and headers (one place for
the publisher, the consumer and the dead letters)."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis.asyncio
from redis.exceptions import ResponseError

from onceonly.errors import ConfigurationError
from onceonly.messaging import HEADER_KEY, HEADER_MESSAGE_ID, OutboxMessage

__all__ = [
    "B64_PREFIX",
    "FIELD_HEADERS",
    "FIELD_ID",
    "FIELD_KEY",
    "FIELD_PAYLOAD",
    "StreamEntry",
    "body",
    "broker_id",
    "dead_letter_fields",
    "headers_of",
    "label",
    "message_id",
    "outbound_fields",
    "text",
    "transient_reply",
]

FIELD_ID = "id"
FIELD_PAYLOAD = "payload"
FIELD_HEADERS = "headers"
FIELD_KEY = "key"
JSON = "application/json"
#: Marks a message id that was not valid UTF-8 (or already started with it): base64 follows.
B64_PREFIX = "b64:"

# Reset the idle time of the entries this consumer still owns; returns the ids kept.


def text(value: bytes | str) -> str:
    """For entry ids, field names and log lines (not message ids: see _message_id)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def message_id(value: Any) -> str:
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


def transient_reply(exc: ResponseError) -> bool:
    return str(exc).split(" ", 1)[0].upper() in _TRANSIENT_REPLIES


def client(url: str | None, connection: redis.asyncio.Redis | None, options: Any) -> Any:
    if (url is None) == (connection is None):
        raise ConfigurationError("pass exactly one of url= or connection=")
    if connection is not None:
        return connection
    assert url is not None
    return redis.asyncio.Redis.from_url(url, **options)


def entry_fields(
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


def label(entry_id: str, fields: Mapping[Any, Any]) -> str:
    """The message id for a log line before the entry is parsed (else the entry id)."""
    mid = fields.get(FIELD_ID, fields.get(FIELD_ID.encode()))
    return text(mid) if mid else f"entry {entry_id}"


def headers_of(value: Any) -> dict[str, Any]:
    if not value:
        return {}
    try:
        decoded = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return {}
    return decoded if isinstance(decoded, dict) else {}


def body(fields: Mapping[str, Any]) -> bytes:
    """The payload field's bytes; without one, the other fields as a JSON object."""
    if FIELD_PAYLOAD in fields:
        value = fields[FIELD_PAYLOAD]
        return value if isinstance(value, bytes) else str(value).encode("utf-8")
    rest = {k: text(v) for k, v in fields.items() if k not in (FIELD_ID, FIELD_HEADERS)}
    return json.dumps(rest, separators=(",", ":")).encode("utf-8")


def outbound_fields(message: OutboxMessage) -> dict[str, bytes | str]:
    """The fields of an outbox row: its id, payload, headers (with ``content-type`` and
    ``onceonly-key``) and key."""
    headers = {"content-type": JSON, **message.headers}
    if message.key is not None:
        headers[HEADER_KEY] = message.key
    return entry_fields(message.id, message.payload, headers, message.key)


def broker_id(fields: Mapping[str, Any], headers: Mapping[str, Any]) -> str | None:
    """The message id an entry carries: the ``id`` field, else the
    ``onceonly-message-id`` header (see :func:`message_id`)."""
    value = fields.get(FIELD_ID) or headers.get(HEADER_MESSAGE_ID)
    return message_id(value) if value else None


def dead_letter_fields(
    fields: Mapping[str, Any], headers: Mapping[str, Any], mid: str | None
) -> dict[str, bytes | str]:
    """The dead entry: the original body and key with the dead-letter ``headers``; the
    ``id`` field as the entry carried it (bytes stay bytes), not its ``b64:`` form."""
    key = fields.get(FIELD_KEY)
    original = fields.get(FIELD_ID)
    as_text = {k: str(v) for k, v in headers.items()}
    dead = entry_fields(None, body(fields), as_text, text(key) if key else None)
    if original or mid:
        dead = {FIELD_ID: original or mid or "", **dead}
    return dead
