# SPDX-License-Identifier: MIT
"""A FastAPI app behind the ASGI middleware, for the real-server tests (uvicorn).

Configured by the environment: ONCEONLY_URL, ONCEONLY_TABLE, EFFECTS (a file that gets a
line each time the handler starts), LEASE (seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import BackgroundTasks, FastAPI, Request, Response
from fastapi.responses import JSONResponse

import onceonly
from onceonly.http.fastapi import IdempotencyMiddleware, idempotency_key, idempotent_tx

options = {"table": os.environ["ONCEONLY_TABLE"]} if os.environ.get("ONCEONLY_TABLE") else {}
store = onceonly.open_async_store(os.environ["ONCEONLY_URL"], **options)
EFFECTS = os.environ["EFFECTS"]
ORDERS = (os.environ.get("ONCEONLY_TABLE") or "t") + "_orders"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    await store.migrate()
    async with store.transaction() as s:
        await s.execute(f"CREATE TABLE IF NOT EXISTS {ORDERS} (item TEXT)")
    yield
    await store.close()


app = FastAPI(lifespan=lifespan)


def effect() -> int:
    with open(EFFECTS, "a") as f:
        f.write("run\n")
    with open(EFFECTS) as f:
        return len(f.readlines())


@app.post("/orders", status_code=201, dependencies=[idempotency_key()])
async def create(request: Request, response: Response) -> dict[str, Any]:
    body = await request.json()
    n = effect()
    await asyncio.sleep(float(request.headers.get("x-sleep", 0)))
    response.headers["Location"] = f"/orders/{n}"
    return {"order": n, "item": body.get("item")}


@app.post("/atomic", status_code=201)
async def atomic(request: Request, tx: Annotated[onceonly.AsyncTx, idempotent_tx()]) -> Any:
    body = await request.json()
    await tx.execute(f"INSERT INTO {ORDERS} (item) VALUES (?)", (body.get("item"),))
    effect()
    await asyncio.sleep(float(request.headers.get("x-sleep", 0)))
    return {"item": body.get("item")}


async def background(request: Request) -> None:
    """A background task: slow (X-Bg-Sleep seconds), or failing (X-Bg-Fail)."""
    await asyncio.sleep(float(request.headers.get("x-bg-sleep", 0)))
    if request.headers.get("x-bg-fail"):
        raise RuntimeError("the background task failed")


@app.post("/background", status_code=202, dependencies=[idempotency_key()])
async def with_background(request: Request, tasks: BackgroundTasks) -> dict[str, Any]:
    n = effect()
    tasks.add_task(background, request)
    return {"order": n}


def committed(item: str) -> bool:
    """Whether a row for ``item`` is visible to another connection (committed)."""
    url = os.environ["ONCEONLY_URL"]
    if url.startswith("sqlite"):
        import sqlite3

        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
            sql = f"SELECT count(*) FROM {ORDERS} WHERE item = ?"
            return bool(conn.execute(sql, (item,)).fetchone()[0])
    import psycopg

    with psycopg.connect(url) as conn:
        sql = f"SELECT count(*) FROM {ORDERS} WHERE item = %s"
        row = conn.execute(sql, (item,)).fetchone()
        return bool(row and row[0])


def seen_by_background(item: str) -> None:
    """A background task's first look (before it awaits anything): committed or not."""
    with open(EFFECTS + ".bg", "a") as f:
        f.write(f"{item} {'committed' if committed(item) else 'uncommitted'}\n")


@app.post("/atomic-background", status_code=201)
async def atomic_background(
    request: Request, tasks: BackgroundTasks, tx: Annotated[onceonly.AsyncTx, idempotent_tx()]
) -> Any:
    body = await request.json()
    await tx.execute(f"INSERT INTO {ORDERS} (item) VALUES (?)", (body.get("item"),))
    effect()
    tasks.add_task(seen_by_background, str(body.get("item")))
    tasks.add_task(background, request)
    return {"item": body.get("item")}


@app.post("/fail", dependencies=[idempotency_key()])
async def fail(request: Request, tasks: BackgroundTasks) -> JSONResponse:
    """A 503 (not stored), with a background task after it."""
    n = effect()
    tasks.add_task(background, request)
    return JSONResponse({"run": n}, status_code=503, background=tasks)


app.add_middleware(
    IdempotencyMiddleware,
    store=store,
    principal=lambda r: r.headers.get("x-user"),
    lease=float(os.environ.get("LEASE", "30")),
)
