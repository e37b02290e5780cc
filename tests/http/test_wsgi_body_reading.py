# SPDX-License-Identifier: MIT
"""WSGI body reading: ``wsgi.input.read(n)`` may return fewer bytes than asked (a chunked
request through an unbuffered stream gives one chunk per call). The middleware reads
until the end or ``CONTENT_LENGTH``, never past ``max_request_bytes``, so the app and
the fingerprint see the whole body."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onceonly
from onceonly.http import HttpPolicy
from onceonly.http.wsgi import IdempotencyMiddleware


class ShortReads:
    """A legal WSGI input stream returning at most ``step`` bytes per read."""

    def __init__(self, data: bytes, step: int) -> None:
        self.data, self.step, self.served = data, step, 0

    def read(self, size: int | None = -1) -> bytes:
        n = len(self.data) if size is None or size < 0 else size
        n = min(n, self.step)
        out, self.data = self.data[:n], self.data[n:]
        self.served += len(out)
        return out

    def readline(self, size: int | None = -1) -> bytes:
        return self.read(size)


def _app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    body = environ["wsgi.input"].read()
    out = json.dumps({"got": body.decode()}).encode()
    start_response(
        "201 Created", [("Content-Type", "application/json"), ("Content-Length", str(len(out)))]
    )
    return [out]


def _call(mw: Any, stream: ShortReads, **extra: str) -> tuple[str, dict[str, str], bytes]:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST", "PATH_INFO": "/charges", "SCRIPT_NAME": "",
        "QUERY_STRING": "", "SERVER_NAME": "x", "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.url_scheme": "http", "wsgi.input": stream,
        "CONTENT_TYPE": "application/json", "HTTP_IDEMPOTENCY_KEY": "k-1", **extra,
    }  # fmt: skip
    if "CONTENT_LENGTH" not in extra:
        environ.update({"wsgi.input_terminated": True, "HTTP_TRANSFER_ENCODING": "chunked"})
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        seen["status"], seen["headers"] = status, {k.lower(): v for k, v in headers}

    out = b"".join(mw(environ, start_response))
    return seen["status"], seen["headers"], out


def test_chunked_body_with_short_reads_is_read_whole(tmp_path: Path) -> None:
    """A chunked body served 8 bytes per read reaches the app whole."""
    store = onceonly.open_store(f"sqlite:///{tmp_path}/s.db", migrate=True)
    try:
        mw = IdempotencyMiddleware(_app, store, principal=lambda r: "client-1")
        status, _, out = _call(mw, ShortReads(b'{"amount": 10}', 8))
        assert status.startswith("201")
        assert json.loads(out) == {"got": '{"amount": 10}'}
    finally:
        store.close()


def test_declared_length_with_short_reads_is_read_whole(tmp_path: Path) -> None:
    """A declared ``CONTENT_LENGTH`` served in short reads is read to its length."""
    store = onceonly.open_store(f"sqlite:///{tmp_path}/s.db", migrate=True)
    try:
        mw = IdempotencyMiddleware(_app, store, principal=lambda r: "client-1")
        body = b'{"amount": 10, "note": "' + b"x" * 100 + b'"}'
        status, _, out = _call(mw, ShortReads(body, 7), CONTENT_LENGTH=str(len(body)))
        assert status.startswith("201") and json.loads(out) == {"got": body.decode()}
    finally:
        store.close()


def test_bodies_differing_after_the_first_read_are_a_mismatch(tmp_path: Path) -> None:
    """Two chunked bodies alike in their first read but not after: 422, not a replay."""
    store = onceonly.open_store(f"sqlite:///{tmp_path}/s.db", migrate=True)
    try:
        mw = IdempotencyMiddleware(_app, store, principal=lambda r: "client-1")
        _call(mw, ShortReads(b'{"amount": 10}', 8))
        status, headers, _ = _call(mw, ShortReads(b'{"amount": 99}', 8))
        assert "idempotent-replayed" not in headers
        assert status.startswith("422")
    finally:
        store.close()


def test_oversized_chunked_body_is_413_read_no_further_than_the_limit(tmp_path: Path) -> None:
    """A chunked body over ``max_request_bytes`` in short reads: 413, at most one byte
    past the limit read; a declared one over it is refused unread."""
    store = onceonly.open_store(f"sqlite:///{tmp_path}/s.db", migrate=True)
    try:
        policy = HttpPolicy(max_request_bytes=100)
        mw = IdempotencyMiddleware(_app, store, principal=lambda r: "client-1", policy=policy)
        stream = ShortReads(b"x" * 10_000, 9)
        status, _, _ = _call(mw, stream)
        assert status.startswith("413") and stream.served == 101
        declared = ShortReads(b"x" * 10_000, 9)
        status, _, _ = _call(mw, declared, CONTENT_LENGTH="10000")
        assert status.startswith("413") and declared.served == 0
        fits = ShortReads(b'"' + b"x" * 98 + b'"', 9)
        status, _, out = _call(mw, fits)
        assert status.startswith("201") and len(json.loads(out)["got"]) == 100
    finally:
        store.close()
