# SPDX-License-Identifier: MIT
"""Two ``Idempotency-Key`` header fields are 400 ``invalid-key`` (docs/http.md, step 3),
counted before they are joined: ``"a`` and ``b"`` join into the valid sf-string
``"a, b"``, yet neither field is a key. ASGI hands each field apart (Starlette, and
Django under ASGI)."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import onceonly
from onceonly.http.asgi import IdempotencyMiddleware

RAN: list[int] = []


async def _orders(request: Request) -> Response:
    RAN.append(1)
    return JSONResponse({"ok": True}, status_code=201)


@pytest.mark.parametrize(
    "fields",
    [['"a', 'b"'], ["k-1", "k-1"], ['"a"', '"b"']],
    ids=["joined-parses", "same-twice", "two-keys"],
)
async def test_two_key_fields_are_refused_before_they_are_joined(fields: list[str]) -> None:
    """Two fields: 400 invalid-key and nothing runs, even when their join would parse."""
    RAN.clear()
    store = onceonly.open_async_store("memory://")
    app = IdempotencyMiddleware(
        Starlette(routes=[Route("/orders", _orders, methods=["POST"])]),
        store,
        principal=lambda r: "client-1",
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.post("/orders", headers=[("Idempotency-Key", f) for f in fields])
        one = await c.post("/orders", headers={"Idempotency-Key": '"a, b"'})
    await store.close()
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["type"].endswith("#invalid-key")
    assert one.status_code == 201 and RAN == [1]  # one field holding "a, b" is a key
