# SPDX-License-Identifier: MIT
"""The concrete path includes the mount prefix (WSGI ``SCRIPT_NAME``, ASGI ``root_path``):
two apps mounted under ``/a`` and ``/b`` that share a store never replay each other's
responses; one key sent under the other prefix is 422 ``key-mismatch``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from werkzeug.middleware.dispatcher import DispatcherMiddleware
from werkzeug.test import Client

import onceonly
from onceonly.http.asgi import IdempotencyMiddleware as AsgiMiddleware
from onceonly.http.wsgi import IdempotencyMiddleware as WsgiMiddleware


def _wsgi_app(tag: str, effects: list[str]) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        environ["wsgi.input"].read()
        effects.append(tag)
        body = json.dumps({"tag": tag}).encode()
        start_response(
            "201 Created",
            [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
        )
        return [body]

    return app


def _not_found(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("404 Not Found", [("Content-Length", "0")])
    return [b""]


def test_wsgi_same_key_under_another_script_name_is_a_mismatch(tmp_path: Path) -> None:
    """POST /b/orders after POST /a/orders with one key: 422, never app A's 201."""
    store = onceonly.open_store(f"sqlite:///{tmp_path}/s.db", migrate=True)
    try:
        effects: list[str] = []
        apps = {
            prefix: WsgiMiddleware(_wsgi_app(prefix, effects), store, principal=lambda r: "c-1")
            for prefix in ("/a", "/b")
        }
        client = Client(DispatcherMiddleware(_not_found, apps))
        headers = {"Idempotency-Key": "k-1"}
        first = client.post("/a/orders", json={"n": 1}, headers=headers)
        assert first.status_code == 201 and first.get_json() == {"tag": "/a"}
        again = client.post("/a/orders", json={"n": 1}, headers=headers)
        assert again.headers.get("Idempotent-Replayed") == "true"
        other = client.post("/b/orders", json={"n": 1}, headers=headers)
        assert other.status_code == 422, other.get_data()
        assert other.headers.get("Idempotent-Replayed") is None
        assert effects == ["/a"]
    finally:
        store.close()


async def _orders(request: Request) -> JSONResponse:
    return JSONResponse({"root": request.scope.get("root_path")}, status_code=201)


async def test_asgi_same_key_under_another_root_path_is_a_mismatch() -> None:
    """An ASGI server mounting one app under /a and /b (``root_path``, the path without
    it): one key under the other prefix is 422, never the other mount's 201."""
    store = onceonly.open_async_store("memory://")
    app = AsgiMiddleware(
        Starlette(routes=[Route("/orders", _orders, methods=["POST"])]),
        store,
        principal=lambda r: "c-1",
    )

    async def post(root: str, url: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=app, root_path=root)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.post(url, json={"n": 1}, headers={"Idempotency-Key": "k-1"})

    first = await post("/a", "/orders")
    assert first.status_code == 201 and first.json() == {"root": "/a"}
    # a server that puts root_path into path too (uvicorn): the same request
    again = await post("/a", "/a/orders")
    assert again.status_code == 201 and again.headers.get("idempotent-replayed") == "true"
    other = await post("/b", "/orders")
    assert other.status_code == 422, other.text
    await store.close()
