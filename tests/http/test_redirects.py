# SPDX-License-Identifier: MIT
"""Redirects (docs/http.md, step 7): a 307 or 308 (a router's trailing-slash redirect:
Starlette 307, Flask 308) says "send this request to Location"; it is not stored and the
key is given back unbound, so the client following it with the same key runs once there
instead of getting 422. Other 3xx (a 303 after a POST that created something) are
stored and replayed like any response."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from flask import Flask, jsonify
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

import onceonly
from onceonly.http import idempotency
from onceonly.http.asgi import IdempotencyMiddleware
from onceonly.http.flask import OnceOnly


def test_following_starlettes_slash_redirect_runs_the_request_once() -> None:
    """POST /items (307 -> /items/) followed with the same key: 201, the handler ran once;
    a retry replays the 201; the key on another request is still 422."""
    effects: list[int] = []

    async def items(request: Request) -> Response:
        effects.append(1)
        return JSONResponse({"id": len(effects)}, status_code=201)

    async def main() -> list[httpx.Response]:
        store = onceonly.open_async_store("memory://")
        app = IdempotencyMiddleware(
            Starlette(routes=[Route("/items/", items, methods=["POST"])]),
            store,
            principal=lambda r: "client-1",
        )
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            h = {"Idempotency-Key": "k-1"}
            out = [
                await c.post("/items", json={"n": 1}, headers=h, follow_redirects=True),
                await c.post("/items", json={"n": 1}, headers=h, follow_redirects=True),
                await c.post("/items/", json={"n": 2}, headers=h),
            ]
        await store.close()
        return out

    first, retry, other = asyncio.run(main())
    assert first.status_code == 201, first.text
    assert [r.status_code for r in first.history] == [307]
    assert retry.status_code == 201 and retry.headers["idempotent-replayed"] == "true"
    assert retry.json() == first.json() == {"id": 1}
    assert other.status_code == 422
    assert effects == [1]


def test_following_flasks_slash_redirect_runs_the_request_once(leased_store: Any) -> None:
    """Flask's 308 to /items/ followed with the same key: 201 once, then replayed."""
    effects: list[int] = []
    app = Flask(__name__)

    @app.post("/items/")
    def items() -> Any:
        effects.append(1)
        return jsonify({"id": len(effects)}), 201

    OnceOnly(app, store=leased_store, principal=lambda r: "client-1")
    # httpx re-sends the body on 307/308 as clients do (Flask's test client drops it)
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://t") as c:
        h = {"Idempotency-Key": "k-308"}
        first = c.post("/items", json={"n": 1}, headers=h, follow_redirects=True)
        assert first.status_code == 201, first.text
        assert [r.status_code for r in first.history] == [308]
        retry = c.post("/items", json={"n": 1}, headers=h, follow_redirects=True)
    assert retry.status_code == 201 and retry.headers["Idempotent-Replayed"] == "true"
    assert effects == [1]


@idempotency("required")
async def _create(request: Request) -> Response:
    _CREATED.append(1)
    return RedirectResponse(f"/things/{len(_CREATED)}", status_code=303)


_CREATED: list[int] = []


async def test_a_303_after_a_post_is_stored_and_replayed() -> None:
    """A 303 See Other (POST-redirect-GET: the effect happened) is stored: the retry
    gets the same 303 and the handler does not run again."""
    _CREATED.clear()
    store = onceonly.open_async_store("memory://")
    app = IdempotencyMiddleware(
        Starlette(routes=[Route("/things", _create, methods=["POST"])]),
        store,
        principal=lambda r: "client-1",
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        h = {"Idempotency-Key": "k-303"}
        first, retry = [await c.post("/things", json={}, headers=h) for _ in range(2)]
    await store.close()
    assert first.status_code == retry.status_code == 303
    assert retry.headers["location"] == first.headers["location"] == "/things/1"
    assert retry.headers["idempotent-replayed"] == "true" and _CREATED == [1]


@pytest.mark.parametrize("status", [307, 308])
async def test_an_atomic_route_redirecting_commits_nothing(tmp_path: Path, status: int) -> None:
    """An atomic route answering 307/308 records nothing (its writes roll back): the
    redirected request with the same key runs there once."""
    store = onceonly.open_async_store(f"sqlite:///{tmp_path / 'a.db'}")
    await store.migrate()
    ran: list[str] = []

    @idempotency("required", atomic=True)
    async def old(request: Request) -> Response:
        ran.append("old")
        tx = request.scope["onceonly.tx"]
        await tx.execute("INSERT INTO moved (path) VALUES ('old')")
        return RedirectResponse("/new", status_code=status)

    @idempotency("required", atomic=True)
    async def new(request: Request) -> Response:
        ran.append("new")
        return JSONResponse({"ok": True}, status_code=201)

    async with store.transaction() as s:
        await s.execute("CREATE TABLE moved (path TEXT)")
    routes = [Route("/old", old, methods=["POST"]), Route("/new", new, methods=["POST"])]
    app = IdempotencyMiddleware(Starlette(routes=routes), store, principal=lambda r: "c-1")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        h = {"Idempotency-Key": "k-atomic"}
        r = await c.post("/old", json={}, headers=h, follow_redirects=True)
        again = await c.post("/new", json={}, headers=h)
    async with store.transaction() as s:
        moved = await (await s.execute("SELECT count(*) FROM moved")).fetchone()
    await store.close()
    assert r.status_code == 201, r.text
    assert again.headers["idempotent-replayed"] == "true"
    assert ran == ["old", "new"] and moved[0] == 0


@pytest.mark.parametrize("status", [307, 308])
async def test_a_redirect_to_another_path_leaves_the_key_free_for_it(status: int) -> None:
    """Leased mode: a handler's own 307/308 to another path gives the key back unbound;
    the redirected request binds it (then another request with it is 422)."""
    ran: list[str] = []

    async def old(request: Request) -> Response:
        ran.append("old")
        return RedirectResponse("/new", status_code=status)

    async def new(request: Request) -> Response:
        ran.append("new")
        return JSONResponse({"ok": True}, status_code=201)

    store = onceonly.open_async_store("memory://")
    routes = [Route("/old", old, methods=["POST"]), Route("/new", new, methods=["POST"])]
    app = IdempotencyMiddleware(Starlette(routes=routes), store, principal=lambda r: "c-1")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        h = {"Idempotency-Key": "k-moved"}
        r = await c.post("/old", json={}, headers=h, follow_redirects=True)
        again = await c.post("/new", json={}, headers=h)
        other = await c.post("/new", json={"n": 2}, headers=h)
    await store.close()
    assert r.status_code == 201, r.text
    assert [x.status_code for x in r.history] == [status]
    assert again.headers["idempotent-replayed"] == "true" and other.status_code == 422
    assert ran == ["old", "new"]
