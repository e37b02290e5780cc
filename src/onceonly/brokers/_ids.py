# SPDX-License-Identifier: MIT
"""Where a consumer takes a message's id from, and how a body becomes a payload."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from onceonly._core.keys import content_key, validate_key
from onceonly.errors import InvalidKey, MissingMessageId

__all__ = ["MessageIds", "decode_body", "valid_id"]


class MessageIds:
    """Where a consumer takes a message's id from.

    The broker's own id (RabbitMQ ``message_id``, the ``Nats-Msg-Id`` header, the
    stream entry's id field) comes first. Without it, ``fallback`` decides:

    * ``None`` — no fallback: :class:`~onceonly.MissingMessageId` (the message is
      dead-lettered with reason ``invalid-id``);
    * ``"content"`` — the SHA-256 of the canonical payload (identical payloads are one
      message);
    * a ``str`` naming a top-level payload field, e.g. ``"event_id"``;
    * a callable ``payload -> str``.
    """

    def __init__(self, fallback: str | Callable[[Any], str] | None = None) -> None:
        self.fallback = fallback

    def resolve(self, broker_id: str | None, payload: Any) -> str:
        """The message id; raises InvalidKey / MissingMessageId when there is none."""
        if broker_id:
            return valid_id(broker_id)
        fb = self.fallback
        if fb is None:
            raise MissingMessageId(
                "the message has no id (no broker message id or header) and the consumer "
                "has no fallback; set message_id='content', a payload field, or a callable"
            )
        if fb == "content":
            return content_key(payload)
        if isinstance(fb, str):
            value = payload.get(fb) if isinstance(payload, dict) else None
            if value is None:
                raise MissingMessageId(
                    f"the message has no broker id and no {fb!r} field in its payload"
                )
            return valid_id(str(value))
        return valid_id(fb(payload))


def valid_id(message_id: object) -> str:
    key = validate_key(message_id, what="message id")
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in key):
        raise InvalidKey("message id contains a lone surrogate (it is not valid UTF-8)")
    return key


def decode_body(body: bytes) -> Any:
    """JSON bodies decode to their value; anything else stays bytes.

    A JSON document nested too deep for the decoder raises ``RecursionError``: the
    consumer dead-letters it as ``undecodable`` (keeping it as bytes would only fail
    later, when the inbox fingerprints it).
    """
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return bytes(body)
