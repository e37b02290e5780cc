# SPDX-License-Identifier: MIT
"""Where a consumer takes a message's id from, and how a body becomes a payload."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from onceonly._core.keys import content_key, validate_key
from onceonly.errors import InvalidKey, MissingMessageId

__all__ = ["MessageIds", "content_type_of", "decode_body", "id_text", "is_json", "valid_id"]


class MessageIds:
    """Where a consumer takes a message's id (its inbox key) from.

    A consumer's ``message_id=`` option given as ``"content"``, a payload field name or a
    callable **is** the key: it is used instead of the broker's id, so one body sent
    twice by a producer that gives every publish a fresh id (aio-pika does) runs once.
    ``message_id=None`` (the default) takes the broker's own id (RabbitMQ
    ``message_id``, the ``Nats-Msg-Id`` header, the stream entry's ``id`` field, the
    SQS ``onceonly-message-id`` attribute) and dead-letters a message without one.

    ``MessageIds(fallback=...)`` takes the broker's id first and ``fallback`` only for
    a message without one:

    * ``None`` — no fallback: :class:`~onceonly.MissingMessageId` (the message is
      dead-lettered with reason ``invalid-id``);
    * ``"content"`` — the SHA-256 of the canonical payload (identical payloads are one
      message);
    * a ``str`` naming a top-level payload field, e.g. ``"event_id"``;
    * a callable ``payload -> str``.

    A field's value or a callable's result is the key when it is a ``str``, its decimal
    text when it is an ``int``; anything else is refused (``invalid-id``): :func:`id_text`.

    Args:
        fallback: the id of a message the broker gave none.
        broker_first: ``False``: ``fallback`` always, the broker's id never (what a
            consumer's plain ``message_id=`` option means).

    .. versionadded:: 0.1
    .. versionchanged:: 0.4 public as ``onceonly.brokers.MessageIds``; a consumer's
       plain ``message_id=`` is the key, over the broker's id.
    """

    def __init__(
        self, fallback: str | Callable[[Any], str] | None = None, *, broker_first: bool = True
    ) -> None:
        self.fallback = fallback
        self.broker_first = broker_first or fallback is None

    @classmethod
    def of(cls, option: MessageIds | str | Callable[[Any], str] | None) -> MessageIds:
        """A consumer's ``message_id=`` option as a policy: a :class:`MessageIds` as it
        is; ``"content"``, a field name or a callable as the key itself; ``None``: the
        broker's id."""
        if isinstance(option, MessageIds):
            return option
        return cls(option, broker_first=option is None)

    def resolve(self, broker_id: str | None, payload: Any) -> str:
        """The message id.

        Raises:
            InvalidKey: the id found is not a valid key.
            MissingMessageId: there is none.
        """
        if broker_id and self.broker_first:
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
                raise MissingMessageId(f"the message has no {fb!r} field in its payload")
            return id_text(value, f"the payload's {fb!r} field")
        return id_text(fb(payload), "message_id callable's result")


def id_text(value: object, what: str) -> str:
    """A message id taken from a payload field or a callable, as a key.

    A ``str`` is the key as it is; an ``int`` (not a ``bool``) its decimal text (so
    ``5`` and ``"5"`` are one key). Anything else (an object, a list, a float, a bool)
    has no one text that every producer would agree on (an object's key order, ``1.0``
    against ``1``): it is refused, the same for a field and a callable.

    Raises:
        InvalidKey: ``value`` is neither, or its text is not a valid key (the consumer
            dead-letters the message with reason ``invalid-id``).
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return valid_id(str(value))
    if not isinstance(value, str):
        raise InvalidKey(
            f"the {what} is a {type(value).__name__}: a message id must be a string or "
            "an integer (build a string key with a message_id callable)"
        )
    return valid_id(value)


def valid_id(message_id: object) -> str:
    key = validate_key(message_id, what="message id")
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in key):
        raise InvalidKey("message id contains a lone surrogate (it is not valid UTF-8)")
    return key


def decode_body(body: bytes, content_type: str | None = None) -> Any:
    """The payload of a body: JSON unless its content type says otherwise.

    A body whose content type is not JSON (``application/octet-stream``, ``text/plain``…)
    stays ``bytes``. Any other body (a JSON content type, or none) must be JSON: one that
    does not parse raises, and the consumer dead-letters it as ``undecodable`` with the
    decode error (on every broker). A JSON document nested too deep for the decoder
    raises ``RecursionError`` and is dead-lettered the same way.
    """
    if content_type and not is_json(content_type):
        return bytes(body)
    return json.loads(body)


def is_json(content_type: str) -> bool:
    """``application/json``, ``text/json`` or a ``+json`` type, parameters ignored."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media in ("application/json", "text/json") or media.endswith("+json")


def content_type_of(headers: Mapping[str, Any]) -> str | None:
    """The ``content-type`` header (any case), when it is text."""
    for name, value in headers.items():
        if isinstance(name, str) and name.lower() == "content-type":
            if isinstance(value, bytes):
                return value.decode("utf-8", "replace")
            return value if isinstance(value, str) else None
    return None
