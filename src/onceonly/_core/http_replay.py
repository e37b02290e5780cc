# SPDX-License-Identifier: MIT
"""Stored HTTP responses (docs/http.md): how a response is kept in a record and replayed.

A record's result is a JSON document ``{"http": 1, "status", "headers", "encoding",
"body"}``; the body is text when it is UTF-8, else base64. A replay carries the stored
status, body and headers, a recomputed ``Content-Length`` (none for 204 and 304) and
``Idempotent-Replayed: true``.

A response that ran but could not be kept (a stream, over the size limit) completes its
key with ``{"http": 1, "unavailable": reason}``: duplicates learn that the request was
served and that its response cannot be replayed, and never run it again.

``Content-Encoding`` is stored with the body whatever the allow-list says: a gzip body
without it is unreadable (:data:`BODY_HEADERS`).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from onceonly._core.state import Record
from onceonly.errors import CorruptRecord

__all__ = [
    "BODY_HEADERS",
    "NO_BODY",
    "StoredResponse",
    "decode_response",
    "encode_response",
    "encode_unavailable",
    "replay_headers",
    "response_doc",
    "response_from_doc",
]

NO_BODY = frozenset({204, 304})
"""Statuses without a body, and without Content-Length (RFC 9110 §8.6)."""

BODY_HEADERS = frozenset({"content-encoding"})
"""Headers that describe the stored bytes themselves: always stored with them."""


@dataclass(frozen=True)
class StoredResponse:
    """A response as stored and replayed.

    ``unavailable`` is set (the reason) for a request that was served but whose response
    could not be kept; ``status``, ``headers`` and ``body`` are then empty.
    """

    status: int
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    unavailable: str | None = None


def response_doc(response: StoredResponse) -> dict[str, object]:
    """``response`` as a JSON document (the body as text when it is UTF-8)."""
    try:
        body, encoding = response.body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(response.body).decode("ascii"), "base64"
    return {
        "http": 1,
        "status": response.status,
        "headers": [list(h) for h in response.headers],
        "encoding": encoding,
        "body": body,
    }


def encode_response(response: StoredResponse) -> str:
    """The record text of ``response``: its :func:`response_doc` as JSON."""
    return json.dumps(response_doc(response), separators=(",", ":"))


def encode_unavailable(reason: str) -> str:
    """The record text of a served request whose response was not kept (``reason``)."""
    return json.dumps({"http": 1, "unavailable": reason[:500]}, separators=(",", ":"))


def response_from_doc(doc: object, scope: str, key: str) -> StoredResponse:
    """The response a :func:`response_doc` describes (``scope``/``key`` name it in errors).

    Raises:
        CorruptRecord: ``doc`` is not a stored HTTP response.
    """
    try:
        if not isinstance(doc, dict) or doc.get("http") != 1:
            raise ValueError("not an HTTP response record")
        if "unavailable" in doc:
            return StoredResponse(0, unavailable=str(doc["unavailable"]))
        raw = doc["body"]
        body = base64.b64decode(raw) if doc["encoding"] == "base64" else raw.encode("utf-8")
        headers = tuple((str(n), str(v)) for n, v in doc["headers"])
        return StoredResponse(int(doc["status"]), headers, body)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptRecord(
            f"the record {scope!r}/{key!r} holds no stored HTTP response: {exc}",
            key=key,
            scope=scope,
        ) from None


def decode_response(record: Record) -> StoredResponse:
    """The response stored in a completed ``record``.

    Raises:
        CorruptRecord: the record holds no stored HTTP response.
    """
    try:
        doc = json.loads(record.result or "")
    except ValueError:
        doc = None
    return response_from_doc(doc, record.scope, record.key)


def replay_headers(response: StoredResponse) -> list[tuple[str, str]]:
    """The headers of a replay: the stored ones, Content-Length and the replay marker.

    A stored body with a ``Content-Encoding`` is replayed in that encoding whatever the
    retry's ``Accept-Encoding`` says, so the replay says ``Vary: Accept-Encoding``: a
    cache in between must not hand it to a client that asked for another encoding.
    """
    length = [] if response.status in NO_BODY else [("content-length", str(len(response.body)))]
    headers = list(response.headers)
    if any(n == "content-encoding" for n, _ in headers):
        varies = [v for n, v in headers if n == "vary"]
        named = {p.strip().lower() for v in varies for p in v.split(",")}
        if "accept-encoding" not in named and "*" not in named:
            headers = [(n, v) for n, v in headers if n != "vary"]
            headers.append(("vary", ", ".join([*varies, "Accept-Encoding"])))
    return [*headers, *length, ("idempotent-replayed", "true")]
