# SPDX-License-Identifier: MIT
"""NATS JetStream's wire format: ids and headers (one place for the publisher, the
consumer and the dead letters), subjects, and opening a connection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from onceonly._core.settle import MAX_ERROR_CHARS, header_text
from onceonly.messaging import HEADER_KEY, OutboxMessage

__all__ = [
    "MSG_ID_HEADER",
    "TRANSPORT_ERRORS",
    "connect",
    "dead_letter_headers",
    "drop",
    "is_literal",
    "label",
    "outbound_headers",
    "subject_matches",
]

log = logging.getLogger("onceonly.brokers.nats")

#: JetStream's message-id header (deduplication within the stream's duplicate window).
MSG_ID_HEADER = "Nats-Msg-Id"

TRANSPORT_ERRORS = (nats.errors.Error, asyncio.TimeoutError, OSError)


def outbound_headers(message: OutboxMessage) -> dict[str, str]:
    """The headers of an outbox row: its id as ``Nats-Msg-Id``, its key as
    ``onceonly-key``."""
    headers: dict[str, str] = dict(message.headers)
    headers[MSG_ID_HEADER] = message.id
    headers["Content-Type"] = "application/json"
    if message.key is not None:
        headers[HEADER_KEY] = message.key
    return headers


def drop(name: str) -> bool:
    """Headers a dead letter does not inherit: JetStream's own (``Nats-*``)."""
    return name.startswith("Nats-")


def ascii_value(value: Any) -> str:
    """A header value with non-ASCII characters escaped (``\\xe9``): header values are
    MIME-like, and readers that parse them as such (nats-py's ``get_msg``) turn 8-bit
    values into ``email.header.Header`` objects."""
    safe = header_text(str(value)).encode("ascii", "backslashreplace").decode("ascii")
    return safe if len(safe) <= MAX_ERROR_CHARS else safe[: MAX_ERROR_CHARS - 3] + "..."


def dead_letter_headers(headers: Mapping[str, Any], durable: str, msg: Msg) -> dict[str, str]:
    """The dead-letter envelope as NATS headers: ASCII values, and a ``Nats-Msg-Id`` of
    ``<durable>:<stream>:<sequence>`` so a redelivery dead-lettered twice is stored once."""
    out = {k: ascii_value(v) for k, v in headers.items()}
    meta = msg.metadata
    out[MSG_ID_HEADER] = f"{durable}:{meta.stream}:{meta.sequence.stream}"
    return out


async def _log_error(exc: Exception) -> None:
    log.warning("nats connection error: %r", exc)


async def connect(url: str, options: Mapping[str, Any], timeout: float) -> Client:
    """Open a connection, bounded by ``timeout`` (nats-py may retry for a long time)."""
    client = Client()
    opts: dict[str, Any] = {"error_cb": _log_error, "name": "onceonly", **options}
    try:
        await asyncio.wait_for(client.connect(url, **opts), timeout)
    except BaseException:
        with contextlib.suppress(Exception):
            await client.close()
        raise
    return client


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether the NATS ``subject`` matches ``pattern`` (``*`` one token, ``>`` the rest)."""
    p_tokens, s_tokens = pattern.split("."), subject.split(".")
    for i, token in enumerate(p_tokens):
        if token == ">":
            return len(s_tokens) > i
        if i >= len(s_tokens) or (token != "*" and token != s_tokens[i]):
            return False
    return len(p_tokens) == len(s_tokens)


def is_literal(subject: str) -> bool:
    return bool(subject) and not any(t in ("*", ">") for t in subject.split("."))


def label(msg: Msg) -> str:
    """The message id for log lines: the ``Nats-Msg-Id``, else stream and sequence."""
    msg_id = (msg.headers or {}).get(MSG_ID_HEADER)
    if msg_id:
        return str(msg_id)
    try:
        meta = msg.metadata
        return f"{meta.stream}#{meta.sequence.stream}"
    except Exception:
        return msg.subject
