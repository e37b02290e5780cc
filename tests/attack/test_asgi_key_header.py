"""ASGI: two ``Idempotency-Key`` fields are 400 invalid-key (docs/http.md, step 3).

ASGI hands the middleware each header field separately. Two fields that, once joined
with ", ", happen to form one quoted sf-string (``"a`` and ``b"`` -> ``"a, b"``) are
still two fields; neither is a valid sf-string on its own. Today they are joined first
and accepted as the single key ``a, b``.
"""

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

import onceonly
from onceonly.http.asgi import IdempotencyMiddleware


async def _orders(request):
    return JSONResponse({"ok": True}, status_code=201)


def test_two_key_fields_are_refused_even_when_their_join_parses():
    async def main():
        store = onceonly.open_async_store("memory://")
        app = IdempotencyMiddleware(
            Starlette(routes=[Route("/orders", _orders, methods=["POST"])]),
            store,
            principal=lambda r: "client-1",
        )
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            r = await c.post("/orders", headers=[("Idempotency-Key", '"a'), ("Idempotency-Key", 'b"')])
        await store.close()
        return r

    r = asyncio.run(main())
    # today: 201, run under the key 'a, b'
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["type"].endswith("#invalid-key")
