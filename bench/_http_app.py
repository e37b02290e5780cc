# SPDX-License-Identifier: MIT
"""The FastAPI app of bench/http_fastapi.py (run by uvicorn; configured by the environment).

POST /orders inserts one row into a table of its own (the endpoint's database work) and
answers 201. With MIDDLEWARE=1 the ASGI IdempotencyMiddleware (leased mode) is installed
on PostgreSQL.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from psycopg_pool import AsyncConnectionPool

import onceonly
from onceonly.http.fastapi import IdempotencyMiddleware, idempotency_key

URL = os.environ["ONCEONLY_URL"]
TABLE = os.environ["ONCEONLY_TABLE"]
pool = AsyncConnectionPool(URL, min_size=4, max_size=16, open=False)
store = onceonly.open_async_store(URL, table=TABLE, min_size=4, max_size=16)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    await pool.open()
    await store.migrate()
    async with pool.connection() as conn:
        await conn.execute(f"CREATE TABLE IF NOT EXISTS {TABLE}_orders (body text)")
    yield
    await pool.close()
    await store.close()


app = FastAPI(lifespan=lifespan)


@app.post("/orders", status_code=201, dependencies=[idempotency_key()])
async def create(request: Request) -> dict[str, Any]:
    body = await request.body()
    async with pool.connection() as conn:
        await conn.execute(f"INSERT INTO {TABLE}_orders (body) VALUES (%s)", (body.decode(),))
    return {"created": True}


if os.environ.get("MIDDLEWARE") == "1":
    app.add_middleware(IdempotencyMiddleware, store=store, principal=lambda r: "bench")
