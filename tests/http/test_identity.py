# SPDX-License-Identifier: MIT
"""A request's identity (docs/http.md, "Identity"): one key names one request of one
client. The same key with another path parameter, query, method, body or fingerprinted
header is 422 ``key-mismatch`` (never a replay of the other request, never a fresh run);
the same request in another JSON spelling replays. FastAPI and a raw ASGI app through
httpx, Flask and a raw WSGI app through their test clients, on every store.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from flask import Flask
from flask import request as flask_request
from flask.testing import FlaskClient

from onceonly.http import HttpPolicy
from onceonly.http.asgi import IdempotencyMiddleware as AsgiMiddleware
from onceonly.http.fastapi import IdempotencyMiddleware, idempotency_key
from onceonly.http.flask import OnceOnly, idempotency
from onceonly.http.wsgi import IdempotencyMiddleware as WsgiMiddleware

POLICY = HttpPolicy(methods=frozenset({"POST", "PATCH", "PUT"}))


def hdrs(key: str = "k1", user: str = "alice", **extra: str) -> dict[str, str]:
    return {"Idempotency-Key": key, "X-User": user, **extra}


def fastapi_app(store: Any, paid: list[Any]) -> FastAPI:
    app = FastAPI()

    @app.post("/orders/{order}/pay", dependencies=[idempotency_key()])
    async def pay(order: int, request: Request, amount: int = 0) -> dict[str, Any]:
        body = await request.body()
        paid.append((order, amount, json.loads(body) if body else None))
        return {"paid": order, "amount": amount, "n": len(paid)}

    @app.patch("/orders/{order}/pay", dependencies=[idempotency_key()])
    async def repay(order: int) -> dict[str, Any]:
        paid.append(("patch", order))
        return {"patched": order}

    @app.post("/charges", dependencies=[idempotency_key(ignore_fields=("sent_at",))])
    async def charge(request: Request) -> dict[str, Any]:
        body = await request.json()
        paid.append(body)
        return {"charged": body["amount"], "n": len(paid)}

    app.add_middleware(
        IdempotencyMiddleware,
        store=store,
        principal=lambda r: r.headers.get("x-user"),
        policy=POLICY,
    )
    return app


def raw_asgi_app(store: Any, paid: list[Any]) -> Any:
    """A bare ASGI app: the route comes from the ``routes`` table."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        paid.append((scope["method"], scope["path"], scope["query_string"], body))
        out = json.dumps({"n": len(paid), "path": scope["path"]}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(out))]
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        await send({"type": "http.response.body", "body": out})

    return AsgiMiddleware(
        app,
        store,
        principal=lambda r: r.headers.get("x-user"),
        routes={"/orders/{id}/pay": "required", "/charges": "required"},
        policy=POLICY,
    )


@pytest.fixture(params=["fastapi", "asgi"])
async def aclient(
    request: pytest.FixtureRequest, leased_async_store: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, list[Any]]]:
    paid: list[Any] = []
    make = fastapi_app if request.param == "fastapi" else raw_asgi_app
    transport = httpx.ASGITransport(app=make(leased_async_store, paid))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        yield c, paid


async def test_asgi_one_key_on_another_order_is_422_and_never_pays_twice(
    aclient: tuple[httpx.AsyncClient, list[Any]],
) -> None:
    """Order 1 then order 2 with one key: 422 for order 2, not order 1's response."""
    c, paid = aclient
    first = await c.post("/orders/1/pay", json={"card": "x"}, headers=hdrs())
    second = await c.post("/orders/2/pay", json={"card": "x"}, headers=hdrs())
    assert first.status_code in (200, 201)
    assert second.status_code == 422, second.text
    assert second.json()["type"].endswith("#key-mismatch")
    assert "idempotent-replayed" not in second.headers
    assert len(paid) == 1
    again = await c.post("/orders/1/pay", json={"card": "x"}, headers=hdrs())
    assert again.headers["idempotent-replayed"] == "true" and again.json() == first.json()


async def test_asgi_query_method_and_body_are_the_request(
    aclient: tuple[httpx.AsyncClient, list[Any]],
) -> None:
    """?amount=5 then ?amount=500, another method or body: 422; reordered query/JSON: replay."""
    c, paid = aclient
    first = await c.post(
        "/orders/1/pay?amount=5&cur=eur", json={"a": 1, "b": [1, 2]}, headers=hdrs()
    )
    assert first.status_code in (200, 201)
    for method, url, body in [
        ("POST", "/orders/1/pay?amount=500&cur=eur", {"a": 1, "b": [1, 2]}),
        ("POST", "/orders/1/pay?amount=5", {"a": 1, "b": [1, 2]}),
        ("PATCH", "/orders/1/pay?amount=5&cur=eur", {"a": 1, "b": [1, 2]}),
        ("POST", "/orders/1/pay?amount=5&cur=eur", {"a": 1, "b": [2, 1]}),
    ]:
        r = await c.request(method, url, json=body, headers=hdrs())
        assert r.status_code == 422, (method, url, body, r.status_code)
    same = await c.post(
        "/orders/1/pay?cur=eur&amount=%35",
        content=b'{ "b": [1, 2],\n "a": 1.0 }',
        headers=hdrs(**{"Content-Type": "application/json"}),
    )
    assert same.headers["idempotent-replayed"] == "true" and same.json() == first.json()
    assert len(paid) == 1


async def test_fastapi_ignore_fields(leased_async_store: Any) -> None:
    """A route that ignores ``sent_at`` replays a retry with a new timestamp; the amount
    still counts."""
    paid: list[Any] = []
    transport = httpx.ASGITransport(app=fastapi_app(leased_async_store, paid))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        first = await c.post("/charges", json={"amount": 5, "sent_at": 1}, headers=hdrs())
        retry = await c.post("/charges", json={"sent_at": 2, "amount": 5}, headers=hdrs())
        other = await c.post("/charges", json={"amount": 500, "sent_at": 2}, headers=hdrs())
    assert retry.headers["idempotent-replayed"] == "true" and retry.json() == first.json()
    assert other.status_code == 422 and len(paid) == 1


def flask_app(store: Any, paid: list[Any]) -> Flask:
    app = Flask(__name__)

    @app.route("/orders/<int:order>/pay", methods=["POST", "PATCH"])
    @idempotency("required")
    def pay(order: int) -> Any:
        paid.append((flask_request.method, order, flask_request.args.to_dict(flat=False)))
        return {"paid": order, "n": len(paid)}, 201

    OnceOnly(app, store=store, principal=lambda r: r.headers.get("x-user"), policy=POLICY)
    return app


def raw_wsgi_app(store: Any, paid: list[Any]) -> Any:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        paid.append((environ["REQUEST_METHOD"], environ["PATH_INFO"], body))
        out = json.dumps({"n": len(paid), "path": environ["PATH_INFO"]}).encode()
        start_response(
            "201 Created", [("Content-Type", "application/json"), ("Content-Length", str(len(out)))]
        )
        return [out]

    return WsgiMiddleware(
        app,
        store,
        principal=lambda r: r.headers.get("x-user"),
        routes={"/orders/{id}/pay": "required"},
        policy=POLICY,
    )


@pytest.fixture(params=["flask", "wsgi"])
def wclient(request: pytest.FixtureRequest, leased_store: Any) -> Iterator[tuple[Any, list[Any]]]:
    paid: list[Any] = []
    if request.param == "flask":
        yield flask_app(leased_store, paid).test_client(), paid
        return
    wrapped = Flask(__name__)  # only for its test client, around the raw WSGI app
    wrapped.wsgi_app = raw_wsgi_app(leased_store, paid)  # type: ignore[method-assign]
    yield wrapped.test_client(), paid


def test_wsgi_one_key_is_one_request(wclient: tuple[FlaskClient, list[Any]]) -> None:
    """Another order, query or method with one key: 422; the same query reordered: replay."""
    c, paid = wclient
    first = c.post("/orders/1/pay?amount=5&cur=eur", json={"a": 1}, headers=hdrs())
    assert first.status_code == 201
    for method, url in [
        ("POST", "/orders/2/pay?amount=5&cur=eur"),
        ("POST", "/orders/1/pay?amount=500&cur=eur"),
        ("PATCH", "/orders/1/pay?amount=5&cur=eur"),
    ]:
        r = c.open(url, method=method, json={"a": 1}, headers=hdrs())
        assert r.status_code == 422, (method, url, r.status_code)
        assert "Idempotent-Replayed" not in r.headers
    same = c.post("/orders/1/pay?cur=eur&amount=5", data=b'{"a": 1.0}', headers=hdrs(
        **{"Content-Type": "application/json"}
    ))  # fmt: skip
    assert same.headers["Idempotent-Replayed"] == "true" and same.data == first.data
    assert len(paid) == 1


@pytest.mark.parametrize(
    "raw",
    [[b"k1", b"k2"], [b'"k1", "k2"'], [b'"a"b"'], [b'"a\\nb"'], ["caf\u00e9".encode("latin-1")]],
    ids=["two-fields", "sf-list", "inner-quote", "bad-escape", "latin-1"],
)
async def test_key_header_that_is_not_one_sf_string_is_400(raw: list[bytes]) -> None:
    """Two fields, an inner quote, another escape or a latin-1 byte: 400 invalid-key."""
    import onceonly

    paid: list[Any] = []
    store = onceonly.open_async_store("memory://")
    app = raw_asgi_app(store, paid)
    headers = [(b"x-user", b"alice")] + [(b"idempotency-key", v) for v in raw]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.post("/charges", content=b"{}", headers=httpx.Headers(headers))
        ok = await c.post("/charges", content=b"{}", headers=hdrs('"k\\"1"'))
    assert r.status_code == 400 and r.json()["type"].endswith("#invalid-key"), r.text
    assert ok.status_code == 201 and len(paid) == 1
