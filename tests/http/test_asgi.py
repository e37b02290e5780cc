# SPDX-License-Identifier: MIT
"""The ASGI middleware in process (FastAPI app, httpx ASGI transport), on every store."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from onceonly._core.http import PROBLEM_TYPE_BASE, HttpPolicy, RouteRule
from onceonly.http.fastapi import IdempotencyMiddleware, idempotency, idempotency_key


def make_app(store: Any, calls: list[Any], **options: Any) -> FastAPI:
    app = FastAPI()

    @app.post("/orders", status_code=201, dependencies=[idempotency_key()])
    async def create(request: Request, response: Response) -> dict[str, Any]:
        body = await request.json()
        calls.append(body)
        await asyncio.sleep(float(body.get("sleep", 0)))
        response.headers["Location"] = f"/orders/{len(calls)}"
        response.headers["Set-Cookie"] = "session=secret"
        response.headers["X-Internal"] = "no"
        status = int(body.get("status", 201))
        if status != 201:
            response.status_code = status
        if body.get("raise"):
            raise RuntimeError("boom")
        return {"order": len(calls)}

    @app.post("/empty", status_code=204)
    @idempotency("optional")
    async def empty() -> Response:
        calls.append("empty")
        return Response(status_code=204)

    @app.post("/stream")
    async def stream() -> StreamingResponse:
        calls.append("stream")

        async def chunks() -> AsyncIterator[bytes]:
            yield b"a"
            yield b"b"

        return StreamingResponse(chunks())

    @app.post("/big")
    async def big() -> Response:
        calls.append("big")
        return Response(b"x" * 2048)

    @app.post("/gzip", dependencies=[idempotency_key()])
    async def gzipped() -> Response:
        calls.append("gzip")
        body = gzip.compress(b'{"order": 1}')
        return Response(body, media_type="application/json", headers={"Content-Encoding": "gzip"})

    @app.post("/stream-rerun")
    @idempotency("optional", rerun_unstored=True)
    async def stream_rerun() -> StreamingResponse:
        calls.append("stream-rerun")

        async def chunks() -> AsyncIterator[bytes]:
            yield b"a"
            yield b"b"

        return StreamingResponse(chunks())

    @app.post("/wait", dependencies=[idempotency_key(wait=5.0)])
    async def slow(request: Request) -> JSONResponse:
        calls.append("wait")
        await asyncio.sleep(0.8)
        return JSONResponse({"n": len(calls)})

    app.add_middleware(
        IdempotencyMiddleware,
        store=store,
        principal=lambda r: r.headers.get("x-user"),
        policy=HttpPolicy(max_response_bytes=1024, max_request_bytes=4096),
        **options,
    )
    return app


@pytest.fixture
def calls() -> list[Any]:
    return []


@pytest.fixture
async def client(leased_async_store: Any, calls: list[Any]) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(leased_async_store, calls)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        yield c


def hdrs(key: str = "k1", user: str = "alice") -> dict[str, str]:
    return {"Idempotency-Key": key, "X-User": user}


async def test_replay_is_faithful(client: httpx.AsyncClient, calls: list[Any]) -> None:
    """A retry gets the first status, body and allow-listed headers, marked replayed."""
    first = await client.post("/orders", json={"a": 1}, headers=hdrs())
    again = await client.post("/orders", json={"a": 1}, headers=hdrs())
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json() == {"order": 1}
    assert "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["location"] == "/orders/1"
    assert again.headers["content-type"] == "application/json"
    assert "set-cookie" not in again.headers and "x-internal" not in again.headers
    assert len(calls) == 1


async def test_204_stays_204(client: httpx.AsyncClient, calls: list[Any]) -> None:
    """A 204 on a marked endpoint replays as a 204 with no body."""
    for _ in range(2):
        r = await client.post("/empty", headers=hdrs())
        assert r.status_code == 204 and r.content == b""
    assert r.headers["idempotent-replayed"] == "true"
    assert calls == ["empty"]


async def test_missing_key_is_400(client: httpx.AsyncClient, calls: list[Any]) -> None:
    """A required route without the header answers problem+json 400; nothing runs."""
    r = await client.post("/orders", json={}, headers={"X-User": "alice"})
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["type"] == PROBLEM_TYPE_BASE + "missing-key"
    assert calls == []


@pytest.mark.parametrize("key", ["", "x" * 256, "a\x01b"])
async def test_invalid_key_is_400(client: httpx.AsyncClient, key: str, calls: list[Any]) -> None:
    """Empty, too long and control-character keys are refused."""
    r = await client.post("/orders", json={}, headers={"Idempotency-Key": key, "X-User": "a"})
    assert r.status_code == 400 and r.json()["type"].endswith("#invalid-key")
    assert calls == []


async def test_quoted_key_is_the_same_key(client: httpx.AsyncClient, calls: list[Any]) -> None:
    """A structured-field string key ("k1") names the same key as k1."""
    await client.post("/orders", json={"a": 1}, headers=hdrs("k1"))
    r = await client.post("/orders", json={"a": 1}, headers=hdrs('"k1"'))
    assert r.headers["idempotent-replayed"] == "true" and len(calls) == 1


async def test_other_body_is_422(client: httpx.AsyncClient, calls: list[Any]) -> None:
    """The same key with another body is a 422 problem, never a replay."""
    await client.post("/orders", json={"a": 1}, headers=hdrs())
    r = await client.post("/orders", json={"a": 2}, headers=hdrs())
    assert r.status_code == 422 and r.json()["type"].endswith("#key-mismatch")
    assert len(calls) == 1


async def test_in_progress_is_409(client: httpx.AsyncClient, calls: list[Any]) -> None:
    """A duplicate while the first runs gets 409 with Retry-After."""
    first = asyncio.create_task(client.post("/orders", json={"sleep": 1.0}, headers=hdrs()))
    await asyncio.sleep(0.4)
    r = await client.post("/orders", json={"sleep": 1.0}, headers=hdrs())
    assert r.status_code == 409 and r.json()["type"].endswith("#in-flight")
    assert int(r.headers["retry-after"]) >= 1
    assert (await first).status_code == 201
    assert len(calls) == 1


async def test_bounded_wait_replays(client: httpx.AsyncClient, calls: list[Any]) -> None:
    """A route with wait= makes the duplicate wait for the first and replay it."""
    first = asyncio.create_task(client.post("/wait", headers=hdrs()))
    await asyncio.sleep(0.4)
    second = await client.post("/wait", headers=hdrs())
    assert second.status_code == 200 and second.headers["idempotent-replayed"] == "true"
    assert (await first).json() == second.json() and calls == ["wait"]


async def test_principals_are_isolated(client: httpx.AsyncClient, calls: list[Any]) -> None:
    """Two principals with one key run twice and never see each other's response."""
    a = await client.post("/orders", json={"a": 1}, headers=hdrs(user="alice"))
    b = await client.post("/orders", json={"a": 1}, headers=hdrs(user="bob"))
    assert a.json() == {"order": 1} and b.json() == {"order": 2}
    assert "idempotent-replayed" not in b.headers


async def test_no_principal_is_refused(client: httpx.AsyncClient, calls: list[Any]) -> None:
    """A key without a principal is refused (403), not stored under a shared scope."""
    r = await client.post("/orders", json={}, headers={"Idempotency-Key": "k"})
    assert r.status_code == 403 and r.json()["type"].endswith("#no-principal")
    assert calls == []


@pytest.mark.parametrize("status", [500, 503, 429, 409])
async def test_unstored_statuses_run_again(
    client: httpx.AsyncClient, calls: list[Any], status: int
) -> None:
    """5xx, 429 and 409 release the key: a retry runs the handler again."""
    for _ in range(2):
        r = await client.post("/orders", json={"status": status}, headers=hdrs())
        assert r.status_code == status and "idempotent-replayed" not in r.headers
    assert len(calls) == 2


async def test_deterministic_4xx_is_stored(client: httpx.AsyncClient, calls: list[Any]) -> None:
    """A 422 answer of the handler itself is replayed."""
    for _ in range(2):
        r = await client.post("/orders", json={"status": 400}, headers=hdrs())
    assert r.status_code == 400 and r.headers["idempotent-replayed"] == "true"
    assert len(calls) == 1


async def test_exception_releases(client: httpx.AsyncClient, calls: list[Any]) -> None:
    """A handler that raises releases the key; the retry runs."""
    for _ in range(2):
        with pytest.raises(RuntimeError):
            await client.post("/orders", json={"raise": True}, headers=hdrs())
    assert len(calls) == 2


@pytest.mark.parametrize("path", ["/stream", "/big"])
async def test_streams_and_big_bodies_complete_unkept(
    client: httpx.AsyncClient, calls: list[Any], path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A streamed or over-limit response reaches the client whole; a retry never runs it
    again but gets 409 replay-unavailable (issue 19 G)."""
    with caplog.at_level(logging.WARNING, logger="onceonly.http"):
        r = await client.post(path, headers=hdrs())
        assert r.status_code == 200 and r.content in (b"ab", b"x" * 2048)
        again = await client.post(path, headers=hdrs())
    assert again.status_code == 409
    assert again.headers["content-type"] == "application/problem+json"
    assert again.json()["type"] == PROBLEM_TYPE_BASE + "replay-unavailable"
    assert calls == [path[1:]]
    assert "without a replayable response" in caplog.text


async def test_a_route_may_rerun_unkept_responses(
    client: httpx.AsyncClient, calls: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """rerun_unstored=True gives the key of a stream back: the retry runs again."""
    with caplog.at_level(logging.WARNING, logger="onceonly.http"):
        for _ in range(2):
            r = await client.post("/stream-rerun", headers=hdrs())
            assert r.status_code == 200 and r.content == b"ab"
    assert calls == ["stream-rerun"] * 2
    assert "the key is released" in caplog.text


async def test_oversized_request_is_413(client: httpx.AsyncClient, calls: list[Any]) -> None:
    """A keyed request over max_request_bytes gets 413 before anything runs."""
    r = await client.post("/orders", content=b"{" + b" " * 5000 + b"}", headers=hdrs())
    assert r.status_code == 413 and r.json()["type"].endswith("#request-too-large")
    assert calls == []


async def test_other_methods_pass(client: httpx.AsyncClient) -> None:
    """GET is not covered: no claim, no replay marker."""
    r = await client.get("/orders", headers=hdrs())
    assert r.status_code == 405


async def test_openapi_declares_the_header(leased_async_store: Any) -> None:
    """The FastAPI dependency puts Idempotency-Key in the OpenAPI schema."""
    schema = make_app(leased_async_store, []).openapi()
    params = schema["paths"]["/orders"]["post"]["parameters"]
    header = [p for p in params if p["name"] == "Idempotency-Key"]
    assert header and header[0]["in"] == "header" and header[0]["required"] is True


async def test_routes_table_overrides(leased_async_store: Any) -> None:
    """routes= sets a rule by template: 'off' ignores the key entirely."""
    calls: list[Any] = []
    app = make_app(leased_async_store, calls, routes={"/orders": RouteRule("off")})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        for _ in range(2):
            r = await c.post("/orders", json={}, headers=hdrs())
            assert "idempotent-replayed" not in r.headers
    assert len(calls) == 2


class _SlowSession:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def update(self, *args: Any) -> Any:
        await asyncio.sleep(0.3)  # a slow store write: cancelled here unless shielded
        return await self._inner.update(*args)


class _SlowWrites:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Any]:
        async with self._inner.session() as s:
            yield _SlowSession(s)


async def test_cancelled_request_still_stores_the_response(leased_async_store: Any) -> None:
    """A request cancelled (client gone) during the store write: the write completes."""
    calls: list[Any] = []
    done = asyncio.Event()
    app = FastAPI()

    @app.post("/pay", status_code=201, dependencies=[idempotency_key()])
    async def pay() -> dict[str, int]:
        calls.append(1)
        done.set()
        return {"paid": len(calls)}

    app.add_middleware(
        IdempotencyMiddleware, store=_SlowWrites(leased_async_store), principal=lambda r: "p"
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        task = asyncio.create_task(c.post("/pay", headers=hdrs()))
        await done.wait()
        await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.5)
        retry = await c.post("/pay", headers=hdrs())
    assert retry.status_code == 201 and retry.headers["idempotent-replayed"] == "true"
    assert calls == [1]


async def test_long_handler_keeps_its_lease(leased_async_store: Any) -> None:
    """A handler longer than the lease keeps the key (the lease is renewed): 409, not a rerun."""
    calls: list[Any] = []
    app = make_app(leased_async_store, calls, lease=0.6)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        first = asyncio.create_task(c.post("/orders", json={"sleep": 1.5}, headers=hdrs()))
        await asyncio.sleep(1.0)
        second = await c.post("/orders", json={"sleep": 1.5}, headers=hdrs())
        assert second.status_code == 409
        assert (await first).status_code == 201
    assert len(calls) == 1


async def test_gzip_replay_is_readable(client: httpx.AsyncClient, calls: list[Any]) -> None:
    """Content-Encoding is stored with the body: a gzip response replays readable."""
    first = await client.post("/gzip", headers=hdrs())
    again = await client.post("/gzip", headers=hdrs())
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["content-encoding"] == "gzip"
    assert again.headers["vary"] == "Accept-Encoding"  # replayed in the stored encoding
    assert first.json() == again.json() == {"order": 1}
    assert calls == ["gzip"]


async def test_in_flight_retry_after_is_short(client: httpx.AsyncClient, calls: list[Any]) -> None:
    """A 409 in-flight says Retry-After of at most 2 s, not the whole 30 s lease."""
    first = asyncio.ensure_future(client.post("/orders", json={"sleep": 0.6}, headers=hdrs()))
    await asyncio.sleep(0.2)
    second = await client.post("/orders", json={"sleep": 0.6}, headers=hdrs())
    await first
    assert second.status_code == 409 and 1 <= int(second.headers["retry-after"]) <= 2
