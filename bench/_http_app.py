# SPDX-License-Identifier: MIT
"""The FastAPI app of bench/http_fastapi.py (run by uvicorn; configured by the environment).

POST /orders inserts one row into a table of its own (the endpoint's database work) and
answers 201. With MIDDLEWARE=1 the ASGI IdempotencyMiddleware (leased mode) is installed
on PostgreSQL; with MIDDLEWARE=idemkit, idemkit's ASGI middleware on its PostgreSQL
backend instead (run by an interpreter that has idemkit installed).
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
MODE = os.environ.get("MIDDLEWARE", "0")
TABLE = os.environ["ONCEONLY_TABLE"]
# small pools: five servers share PostgreSQL's max_connections (100 by default)
pool = AsyncConnectionPool(URL, min_size=2, max_size=8, open=False)
store = onceonly.open_async_store(URL, table=TABLE, min_size=1, max_size=8)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    await pool.open()
    await store.migrate()
    if MODE == "idemkit":
        from idemkit.backends.postgres import init_pg

        await init_pg(URL, table=f"{TABLE}_idemkit")
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


if MODE == "1":
    app.add_middleware(IdempotencyMiddleware, store=store, principal=lambda r: "bench")
elif MODE == "idemkit":
    import idemkit
    from idemkit.backends.postgres import PostgresBackend

    app.add_middleware(
        idemkit.IdempotencyMiddleware,
        backend=PostgresBackend.from_url(
            URL, table=f"{TABLE}_idemkit", min_size=1, max_size=8, command_timeout=30
        ),
        config=idemkit.HttpConfig(scope=lambda request: "bench"),
    )
