# SPDX-License-Identifier: MIT
"""The WSGI middleware in process (Flask app through the Flask extension), on every store."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask, Response, jsonify, request
from flask.testing import FlaskClient

from onceonly._core.http import HttpPolicy
from onceonly.http.flask import OnceOnly, idempotency


def make_app(store: Any, calls: list[Any], **options: Any) -> Flask:
    app = Flask(__name__)

    @app.post("/orders/<int:shop>")
    @idempotency("required")
    def create(shop: int) -> Any:
        body = request.get_json()
        calls.append(body)
        time.sleep(float(body.get("sleep", 0)))
        status = int(body.get("status", 201))
        if body.get("raise"):
            raise RuntimeError("boom")
        resp = jsonify({"order": len(calls), "shop": shop})
        resp.status_code = status
        resp.headers["Location"] = f"/orders/{shop}/{len(calls)}"
        resp.set_cookie("session", "secret")
        return resp

    @app.post("/stream")
    def stream() -> Response:
        calls.append("stream")
        return Response(iter([b"a", b"b"]))

    @app.post("/big")
    def big() -> Response:
        calls.append("big")
        return Response(b"x" * 2048)

    OnceOnly(
        app,
        store=store,
        principal=lambda r: r.headers.get("x-user"),
        policy=HttpPolicy(max_response_bytes=1024, max_request_bytes=4096),
        **options,
    )
    app.config["PROPAGATE_EXCEPTIONS"] = True
    return app


@pytest.fixture
def calls() -> list[Any]:
    return []


@pytest.fixture
def client(leased_store: Any, calls: list[Any]) -> Iterator[FlaskClient]:
    store = leased_store
    with make_app(store, calls).test_client() as c:
        yield c


def hdrs(key: str = "k1", user: str = "alice") -> dict[str, str]:
    return {"Idempotency-Key": key, "X-User": user}


def test_replay_is_faithful(client: FlaskClient, calls: list[Any]) -> None:
    """Status, body and allow-listed headers replay; Set-Cookie does not."""
    first = client.post("/orders/7", json={"a": 1}, headers=hdrs())
    again = client.post("/orders/7", json={"a": 1}, headers=hdrs())
    assert first.status_code == again.status_code == 201
    assert first.get_json() == again.get_json() == {"order": 1, "shop": 7}
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Location"] == "/orders/7/1"
    assert "Set-Cookie" in first.headers and "Set-Cookie" not in again.headers
    assert len(calls) == 1


def test_one_key_on_two_paths_of_one_rule_is_a_mismatch(
    client: FlaskClient, calls: list[Any]
) -> None:
    """One key on two paths of one rule: the concrete path is in the fingerprint, so 422."""
    client.post("/orders/7", json={"a": 1}, headers=hdrs())
    r = client.post("/orders/8", json={"a": 1}, headers=hdrs())
    assert r.status_code == 422 and "Idempotent-Replayed" not in r.headers
    assert len(calls) == 1


def test_errors(client: FlaskClient, calls: list[Any]) -> None:
    """400 without a key on a required view, 422 on another body, 403 without principal."""
    assert client.post("/orders/1", json={}, headers={"X-User": "a"}).status_code == 400
    client.post("/orders/1", json={"a": 1}, headers=hdrs())
    r = client.post("/orders/1", json={"a": 2}, headers=hdrs())
    assert r.status_code == 422 and r.mimetype == "application/problem+json"
    assert client.post("/orders/1", json={}, headers={"Idempotency-Key": "x"}).status_code == 403
    assert len(calls) == 1


def test_in_progress_is_409(leased_store: Any, calls: list[Any]) -> None:
    """A duplicate during the first request gets 409 + Retry-After."""
    store = leased_store
    app = make_app(store, calls)
    out: list[int] = []
    t = threading.Thread(
        target=lambda: out.append(
            app.test_client().post("/orders/1", json={"sleep": 1.2}, headers=hdrs()).status_code
        )
    )
    t.start()
    time.sleep(0.5)
    r = app.test_client().post("/orders/1", json={"sleep": 1.2}, headers=hdrs())
    t.join()
    assert r.status_code == 409 and int(r.headers["Retry-After"]) >= 1
    assert out == [201] and len(calls) == 1


def test_principals_are_isolated(client: FlaskClient, calls: list[Any]) -> None:
    """Two principals, one key: two runs."""
    client.post("/orders/1", json={"a": 1}, headers=hdrs(user="alice"))
    r = client.post("/orders/1", json={"a": 1}, headers=hdrs(user="bob"))
    assert r.get_json()["order"] == 2 and "Idempotent-Replayed" not in r.headers


@pytest.mark.parametrize("status", [500, 429])
def test_unstored_statuses_run_again(client: FlaskClient, calls: list[Any], status: int) -> None:
    """5xx and 429 release the key."""
    for _ in range(2):
        assert client.post("/orders/1", json={"status": status}, headers=hdrs()).status_code == (
            status
        )
    assert len(calls) == 2


def test_exception_releases(client: FlaskClient, calls: list[Any]) -> None:
    """A view that raises releases the key; the retry runs again."""
    for _ in range(2):
        with pytest.raises(RuntimeError):
            client.post("/orders/1", json={"raise": True}, headers=hdrs())
    assert len(calls) == 2


@pytest.mark.parametrize("path", ["/stream", "/big"])
def test_streams_and_big_bodies_complete_unkept(
    client: FlaskClient, calls: list[Any], path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Streamed and over-limit responses pass through whole; a retry never runs them again
    and gets 409 replay-unavailable (issue 19 G)."""
    with caplog.at_level(logging.WARNING, logger="onceonly.http"):
        r = client.post(path, headers=hdrs())
        assert r.status_code == 200 and r.data in (b"ab", b"x" * 2048)
        again = client.post(path, headers=hdrs())
    assert again.status_code == 409 and again.json["type"].endswith("#replay-unavailable")
    assert calls == [path[1:]]
    assert "without a replayable response" in caplog.text


def test_oversized_body_is_refused_unread(leased_store: Any) -> None:
    """A keyed request declaring a body over the limit gets 413 and its body is never read
    (issue 19 G: 200 MiB were read into memory first)."""
    from onceonly.http.wsgi import IdempotencyMiddleware

    class Body:
        read_bytes = 0

        def read(self, n: int = -1) -> bytes:
            size = 200 * 1024 * 1024 if n < 0 else n
            self.read_bytes += size
            return b"x" * min(size, 1 << 20)

    ran: list[int] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        ran.append(1)
        start_response("201 Created", [("Content-Length", "0")])
        return [b""]

    mw = IdempotencyMiddleware(app, leased_store, principal=lambda r: "alice", default="required")
    body = Body()
    environ = {
        "REQUEST_METHOD": "POST", "PATH_INFO": "/up", "CONTENT_LENGTH": str(200 * 1024 * 1024),
        "HTTP_IDEMPOTENCY_KEY": "k1", "wsgi.input": body,
    }  # fmt: skip
    seen: list[str] = []
    out = mw(environ, lambda status, headers, exc_info=None: seen.append(status))
    assert seen == ["413 Request Entity Too Large"] and b"request-too-large" in b"".join(out)
    assert body.read_bytes == 0 and ran == []


def test_oversized_request_is_413(client: FlaskClient, calls: list[Any]) -> None:
    """A keyed body over the limit gets 413 and nothing runs."""
    r = client.post("/orders/1", data=b"{" + b" " * 5000 + b"}", headers=hdrs())
    assert r.status_code == 413 and calls == []


def test_long_view_keeps_its_lease(leased_store: Any, calls: list[Any]) -> None:
    """A view longer than the lease keeps the key (renewed): the duplicate gets 409."""
    store = leased_store
    app = make_app(store, calls, lease=0.6)
    out: list[int] = []
    t = threading.Thread(
        target=lambda: out.append(
            app.test_client().post("/orders/1", json={"sleep": 1.5}, headers=hdrs()).status_code
        )
    )
    t.start()
    time.sleep(1.0)
    r = app.test_client().post("/orders/1", json={"sleep": 1.5}, headers=hdrs())
    t.join()
    assert r.status_code == 409 and out == [201] and len(calls) == 1
