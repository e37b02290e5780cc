"""A framework's trailing-slash redirect is stored as the key's answer, so the client
that follows it (same key, as every HTTP client does on 307/308) gets 422 key-mismatch
and its request never runs: the key is burnt by a response the app never produced.

Starlette's router answers POST /items with 307 -> /items/ (Flask: 308). The
middleware stores that 3xx under the key; the redirected POST /items/ carries the same
key and another path, so it is refused. Expected: the redirected request runs once
(201), e.g. because a redirect to another path does not complete the key.
"""

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

import onceonly
from onceonly.http.asgi import IdempotencyMiddleware


def test_following_the_routers_slash_redirect_runs_the_request_once():
    effects = []

    async def items(request):
        effects.append(1)
        return JSONResponse({"id": len(effects)}, status_code=201)

    async def main():
        store = onceonly.open_async_store("memory://")
        app = IdempotencyMiddleware(
            Starlette(routes=[Route("/items/", items, methods=["POST"])]),
            store,
            principal=lambda r: "client-1",
        )
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            r = await c.post("/items", json={"n": 1}, headers={"Idempotency-Key": "k-1"}, follow_redirects=True)
        await store.close()
        return r

    r = asyncio.run(main())
    # today: 422 key-mismatch after the stored 307, and the handler never ran
    assert r.status_code == 201, r.text
    assert effects == [1]
