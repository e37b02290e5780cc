# SPDX-License-Identifier: MIT
"""Atomic HTTP mode: the handler's writes and the stored response commit together
(FastAPI through the ASGI middleware, Flask through the WSGI one; SQLite and PostgreSQL)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Annotated, Any

import httpx
import pytest
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from flask import Flask, abort
from flask import request as flask_request

import onceonly
from onceonly.http.fastapi import IdempotencyMiddleware, idempotent_tx
from onceonly.http.flask import OnceOnly, current_tx, idempotency
from tests.conftest import drop_pg_table, require_postgres, unique_table


def url_of(kind: str, tmp_path: Path) -> str:
    if kind == "postgres":
        return require_postgres()
    return f"sqlite:///{tmp_path / 'a.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    table = unique_table()
    yield url_of(request.param, tmp_path), table
    if request.param == "postgres":
        for t in (table, f"{table}_orders", f"{table}_outbox"):
            drop_pg_table(t)


def asgi_app(store: Any, orders: str) -> FastAPI:
    app = FastAPI()

    @app.post("/orders", status_code=201)
    async def create(
        request: Request, tx: Annotated[onceonly.AsyncTx, idempotent_tx()]
    ) -> Response:
        body = await request.json()
        await tx.execute(f"INSERT INTO {orders} (item) VALUES (?)", (body["item"],))
        status = int(body.get("status", 201))
        if body.get("raise"):
            raise RuntimeError("boom")
        if body.get("http_error"):
            raise HTTPException(int(body["http_error"]), "refused")
        if body.get("stream"):

            async def chunks() -> AsyncIterator[bytes]:
                yield b"x"

            return StreamingResponse(chunks())
        return JSONResponse({"item": body["item"]}, status_code=status)

    app.add_middleware(
        IdempotencyMiddleware, store=store, principal=lambda r: r.headers.get("x-user")
    )
    return app


H = {"Idempotency-Key": "k1", "X-User": "alice"}


@pytest.fixture
async def asgi(where: tuple[str, str]) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    url, table = where
    store = onceonly.open_async_store(url, table=table, outbox_table=f"{table}_outbox")
    await store.migrate()
    async with store.transaction() as s:
        await s.execute(f"CREATE TABLE {table}_orders (item TEXT)")

    app = asgi_app(store, f"{table}_orders")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        yield c, table
    await store.close()


def rows(where: tuple[str, str]) -> int:
    url, table = where
    store = onceonly.open_store(url, table=table)
    with store.transaction() as s:
        n = int(s.execute(f"SELECT count(*) FROM {table}_orders").fetchone()[0])
    store.close()
    return n


async def test_asgi_commits_writes_with_the_response(
    asgi: tuple[httpx.AsyncClient, str], where: tuple[str, str]
) -> None:
    """One row and a replay with the stored status for the retry."""
    c, _ = asgi
    first = await c.post("/orders", json={"item": "a"}, headers=H)
    again = await c.post("/orders", json={"item": "a"}, headers=H)
    assert first.status_code == again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true" and again.json() == {"item": "a"}
    assert rows(where) == 1
    r = await c.post("/orders", json={"item": "b"}, headers=H)
    assert r.status_code == 422 and rows(where) == 1


async def test_asgi_missing_key_is_400(
    asgi: tuple[httpx.AsyncClient, str], where: tuple[str, str]
) -> None:
    """An atomic route requires the key."""
    c, _ = asgi
    r = await c.post("/orders", json={"item": "a"}, headers={"X-User": "alice"})
    assert r.status_code == 400 and rows(where) == 0


@pytest.mark.parametrize("body", [{"status": 500}, {"status": 429}])
async def test_asgi_unstored_status_rolls_back(
    asgi: tuple[httpx.AsyncClient, str], where: tuple[str, str], body: dict[str, Any]
) -> None:
    """A 5xx or 429 is sent as it is and its writes roll back; the retry runs again."""
    c, _ = asgi
    for _ in range(2):
        r = await c.post("/orders", json={"item": "a", **body}, headers=H)
        assert r.status_code == body["status"] and "idempotent-replayed" not in r.headers
    assert rows(where) == 0


async def test_asgi_exception_rolls_back(
    asgi: tuple[httpx.AsyncClient, str], where: tuple[str, str]
) -> None:
    """A handler that raises commits nothing."""
    c, _ = asgi
    with pytest.raises(RuntimeError):
        await c.post("/orders", json={"item": "a", "raise": True}, headers=H)
    assert rows(where) == 0


async def test_asgi_unstorable_response_rolls_back(
    asgi: tuple[httpx.AsyncClient, str], where: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A streamed response cannot be stored: 500 response-not-stored, nothing committed."""
    c, _ = asgi
    with caplog.at_level(logging.WARNING, logger="onceonly.http"):
        r = await c.post("/orders", json={"item": "a", "stream": True}, headers=H)
    assert r.status_code == 500 and r.json()["type"].endswith("#response-not-stored")
    assert rows(where) == 0 and "rolled back" in caplog.text


@pytest.mark.parametrize("code", [400, 404])
async def test_asgi_http_exception_rolls_back_writes(
    asgi: tuple[httpx.AsyncClient, str], where: tuple[str, str], code: int
) -> None:
    """A handler that writes through tx, then raises HTTPException: its writes roll back;
    the deterministic 4xx is stored and replayed (issue 19 D)."""
    c, _ = asgi
    body = {"item": "a", "http_error": code}
    first = await c.post("/orders", json=body, headers=H)
    again = await c.post("/orders", json=body, headers=H)
    assert first.status_code == again.status_code == code
    assert again.headers["idempotent-replayed"] == "true"
    assert rows(where) == 0


def test_flask_abort_rolls_back_writes(where: tuple[str, str]) -> None:
    """Flask: a view that writes through current_tx() and then abort(404)s commits nothing;
    the 404 is replayed (issue 19 D)."""
    url, table = where
    store = onceonly.open_store(url, table=table, outbox_table=f"{table}_outbox", migrate=True)
    with store.transaction() as s:
        s.execute(f"CREATE TABLE {table}_orders (item TEXT)")
    app = Flask(__name__)

    @app.post("/orders")
    @idempotency("required", atomic=True)
    def create() -> Any:
        current_tx().execute(f"INSERT INTO {table}_orders (item) VALUES (?)", ("a",))
        abort(404)

    OnceOnly(app, store=store, principal=lambda r: r.headers.get("x-user"))
    c = app.test_client()
    first = c.post("/orders", json={}, headers=H)
    again = c.post("/orders", json={}, headers=H)
    assert first.status_code == again.status_code == 404
    assert again.headers["Idempotent-Replayed"] == "true"
    assert rows(where) == 0
    store.close()


def test_flask_atomic(where: tuple[str, str]) -> None:
    """Flask: current_tx() writes commit with the response; a 500 rolls them back."""
    url, table = where
    store = onceonly.open_store(url, table=table, outbox_table=f"{table}_outbox", migrate=True)
    with store.transaction() as s:
        s.execute(f"CREATE TABLE {table}_orders (item TEXT)")
    app = Flask(__name__)

    @app.post("/orders")
    @idempotency("required", atomic=True)
    def create() -> Any:
        body = flask_request.get_json()
        current_tx().execute(f"INSERT INTO {table}_orders (item) VALUES (?)", (body["item"],))
        return {"item": body["item"]}, int(body.get("status", 201))

    OnceOnly(app, store=store, principal=lambda r: r.headers.get("x-user"))
    c = app.test_client()
    first = c.post("/orders", json={"item": "a"}, headers=H)
    again = c.post("/orders", json={"item": "a"}, headers=H)
    assert first.status_code == again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true" and rows(where) == 1
    h2 = {**H, "Idempotency-Key": "k2"}
    assert c.post("/orders", json={"item": "b", "status": 503}, headers=h2).status_code == 503
    assert rows(where) == 1
    store.close()


def test_current_tx_outside_an_atomic_view() -> None:
    """current_tx() outside an atomic view is a ConfigurationError."""
    app = Flask(__name__)
    with app.test_request_context(), pytest.raises(onceonly.ConfigurationError):
        current_tx()
