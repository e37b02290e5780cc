# SPDX-License-Identifier: MIT
"""HTTP requests reach the event listeners (Prometheus, OpenTelemetry, DuplicateCounter)
with bounded labels: the method and the route template, never the principal, the
concrete path or the key."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
from fastapi import FastAPI
from flask import Flask
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest

import onceonly
from onceonly.admin import Admin, DuplicateCounter
from onceonly.events import Event
from onceonly.http.fastapi import IdempotencyMiddleware, idempotency_key, idempotent_tx
from onceonly.http.flask import OnceOnly, idempotency
from onceonly.prometheus import PrometheusMetrics
from onceonly.tracing import OpenTelemetrySpans

SECRETS = ("principal-alice", "principal-bob", "/orders/41/pay", "/orders/42/pay", "key-")


def send_all(post: Any) -> list[int]:
    """A run, a replay, a mismatch, another principal's run, a failure, an unmatched path."""

    def h(key: str, who: str = "principal-alice") -> dict[str, str]:
        return {"Idempotency-Key": key, "X-User": who}

    return [
        post("/orders/41/pay", h("key-1")),
        post("/orders/41/pay", h("key-1")),
        post("/orders/42/pay", h("key-1")),
        post("/orders/41/pay", h("key-1", "principal-bob")),
        post("/orders/41/fail", h("key-2")),
        post("/nowhere/7", h("key-3")),
    ]


async def test_asgi_events_reach_prometheus_and_opentelemetry() -> None:
    """Completed, replayed, mismatch and failed events, labelled by method and template."""
    registry = CollectorRegistry()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen: list[Event] = []
    app = FastAPI()

    @app.post("/orders/{order}/pay", dependencies=[idempotency_key()])
    async def pay(order: int) -> dict[str, int]:
        return {"paid": order}

    @app.post("/orders/{order}/fail", dependencies=[idempotency_key()])
    async def fail(order: int) -> Any:
        from fastapi.responses import JSONResponse

        return JSONResponse({"error": "down"}, status_code=502)

    app.add_middleware(
        IdempotencyMiddleware,
        store=onceonly.open_async_store("memory://"),
        principal=lambda r: r.headers.get("x-user"),
        listeners=[
            PrometheusMetrics(registry),
            OpenTelemetrySpans(provider.get_tracer("t")),
            seen.append,
        ],
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        statuses = []
        for path, headers in _requests():
            statuses.append((await c.post(path, json={}, headers=headers)).status_code)
    assert statuses == [200, 200, 422, 200, 502, 404]
    kinds = [(e.scope, e.kind.value) for e in seen]
    label = "http:POST /orders/{order}/pay"
    assert kinds == [
        (label, "completed"),
        (label, "replayed"),
        (label, "mismatch"),
        (label, "completed"),
        ("http:POST /orders/{order}/fail", "failed"),
        ("http:POST <unmatched>", "completed"),  # the app's 404 is stored, as any 4xx
    ]
    metrics = generate_latest(registry).decode()
    assert f'onceonly_events_total{{outcome="replayed",scope="{label}"}} 1.0' in metrics
    spans = exporter.get_finished_spans()
    attributes = " ".join(str(dict(s.attributes or {})) for s in spans)
    assert label in attributes
    for secret in SECRETS:
        assert secret not in metrics and secret not in attributes
        assert all(secret not in e.scope for e in seen)


def _requests() -> list[tuple[str, dict[str, str]]]:
    out: list[tuple[str, dict[str, str]]] = []
    send_all(lambda path, headers: out.append((path, headers)) or 0)
    return out


def test_wsgi_events_reach_the_duplicate_counter(tmp_path: Path) -> None:
    """Flask: DuplicateCounter counts claims and replays per method and route template."""
    store = onceonly.open_store(f"sqlite:///{tmp_path / 'e.db'}", migrate=True)
    counter = DuplicateCounter(store, flush_seconds=3600)
    seen: list[Event] = []
    app = Flask(__name__)

    @app.post("/orders/<int:order>/pay")
    @idempotency("required")
    def pay(order: int) -> Any:
        return {"paid": order}, 201

    @app.post("/orders/<int:order>/fail")
    @idempotency("required")
    def fail(order: int) -> Any:
        return {"error": "down"}, 502

    OnceOnly(
        app,
        store=store,
        principal=lambda r: r.headers.get("x-user"),
        listeners=[counter, seen.append],
    )
    client = app.test_client()
    statuses = send_all(
        lambda path, headers: client.post(path, json={}, headers=headers).status_code
    )
    assert statuses == [201, 201, 422, 201, 502, 404]
    label = "http:POST /orders/<int:order>/pay"
    assert [e.kind.value for e in seen if e.scope == label] == [
        "completed", "replayed", "mismatch", "completed",
    ]  # fmt: skip
    counter.flush()
    pay_stats = Admin(store).stats(scope=label).scopes[0]
    assert (pay_stats.claims, pay_stats.replays) == (3, 1)
    for secret in SECRETS:
        assert all(secret not in e.scope for e in seen)
    store.close()


async def test_atomic_route_events_carry_the_route_label(tmp_path: Path) -> None:
    """An atomic route's inbox events reach the listeners relabelled by method and route."""
    seen: list[Event] = []
    store = onceonly.open_async_store(f"sqlite:///{tmp_path / 'a.db'}")
    await store.migrate()
    app = FastAPI()

    @app.post("/transfers/{account}", status_code=201)
    async def transfer(account: int, tx: Annotated[onceonly.AsyncTx, idempotent_tx()]) -> Any:
        return {"account": account}

    app.add_middleware(
        IdempotencyMiddleware,
        store=store,
        principal=lambda r: r.headers.get("x-user"),
        listeners=[seen.append],
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        h = {"Idempotency-Key": "key-9", "X-User": "principal-alice"}
        statuses = [(await c.post(p, json={}, headers=h)) for p in
                    ("/transfers/41", "/transfers/41", "/transfers/42")]  # fmt: skip
    await store.close()
    assert [r.status_code for r in statuses] == [201, 201, 422], statuses[0].text
    label = "http:POST /transfers/{account}"
    assert [(e.scope, e.kind.value) for e in seen] == [
        (label, "completed"), (label, "replayed"), (label, "mismatch"),
    ]  # fmt: skip


async def _raw_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """201 ``A`` after a 2 s stall that blocks the event loop (``x-stall``), else
    201 ``B``; ``/stream`` streams (no Content-Length), ``/down`` answers 503."""
    while (await receive()).get("more_body", False):
        pass
    headers = dict(scope["headers"])
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b"})
        return
    if scope["path"] == "/down":
        await send({"type": "http.response.start", "status": 503, "headers": []})
        await send({"type": "http.response.body", "body": b"down"})
        return
    body = b"B"
    if b"x-stall" in headers:
        STALLED.set()
        time.sleep(2.0)  # blocks the loop: no lease renewal runs
        body = b"A"
    length = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 201, "headers": length})
    await send({"type": "http.response.body", "body": body})


STALLED = threading.Event()


def _middleware(store: Any, seen: list[Event], lease: float = 30.0) -> Any:
    from onceonly.http.asgi import IdempotencyMiddleware as Asgi

    return Asgi(
        _raw_app,
        store,
        principal=lambda r: r.headers.get("x-user"),
        routes={"/pay": "required", "/stream": "required", "/down": "required"},
        lease=lease,
        listeners=[seen.append],
    )


async def _post(app: Any, path: str, **headers: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        h = {"Idempotency-Key": "key-1", "X-User": "principal-alice", **headers}
        return await c.post(path, content=b"{}", headers=h)


async def test_unkept_and_unstored_responses_have_their_own_outcomes() -> None:
    """A stream completes the key as served (``completed``; the duplicate's 409
    replay-unavailable is ``replayed``); a 503 gives the key back (``failed``, twice)."""
    seen: list[Event] = []
    app = _middleware(onceonly.open_async_store("memory://"), seen)
    statuses = [(await _post(app, p)).status_code for p in ("/stream", "/stream")]
    statuses += [(await _post(app, "/down", **{"Idempotency-Key": "k2"})).status_code
                 for _ in range(2)]  # fmt: skip
    assert statuses == [200, 409, 503, 503]
    assert [(e.scope, e.kind.value) for e in seen] == [
        ("http:POST /stream", "completed"), ("http:POST /stream", "replayed"),
        ("http:POST /down", "failed"), ("http:POST /down", "failed"),
    ]  # fmt: skip


def test_a_stalled_holder_reports_lease_lost(tmp_path: Path) -> None:
    """A holder stalled past its lease, taken over by a duplicate that stored ``B``,
    sends ``B`` and emits ``lease_lost`` (never ``completed``); the winner ``completed``."""
    url = f"sqlite:///{tmp_path / 'l.db'}"
    stalled: list[Event] = []
    winner: list[Event] = []
    answers: list[httpx.Response] = []

    async def run_stalled() -> None:
        store = onceonly.open_async_store(url)
        await store.migrate()
        answers.append(
            await _post(_middleware(store, stalled, lease=0.5), "/pay", **{"X-Stall": "1"})
        )
        await store.close()

    STALLED.clear()
    thread = threading.Thread(target=asyncio.run, args=(run_stalled(),))
    thread.start()
    assert STALLED.wait(10)
    time.sleep(0.9)  # the stalled holder's lease (0.5 s) lapses

    async def run_winner() -> httpx.Response:
        store = onceonly.open_async_store(url)
        try:
            return await _post(_middleware(store, winner, lease=0.5), "/pay")
        finally:
            await store.close()

    won = asyncio.run(run_winner())
    thread.join(20)
    assert (won.status_code, won.content) == (201, b"B")
    assert (answers[0].status_code, answers[0].content) == (201, b"B")
    assert answers[0].headers.get("idempotent-replayed") == "true"
    assert [e.kind.value for e in winner] == ["completed"]
    assert [(e.scope, e.kind.value) for e in stalled] == [("http:POST /pay", "lease_lost")]


async def test_routes_inside_a_mount_are_labelled_with_its_prefix() -> None:
    """A route in a Starlette ``Mount`` (nested too) is labelled by the mounts' prefixes
    and its template, never ``<unmatched>``; its marked rule applies."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Mount, Route

    from onceonly.http import idempotency
    from onceonly.http.asgi import IdempotencyMiddleware as Asgi

    @idempotency("required")
    async def pay(request: Request) -> JSONResponse:
        return JSONResponse({"order": request.path_params["order"]}, status_code=201)

    inner = [Route("/orders/{order}/pay", pay, methods=["POST"])]
    app = Starlette(routes=[Mount("/api", routes=[Mount("/v1", routes=inner)])])
    seen: list[Event] = []
    store = onceonly.open_async_store("memory://")
    mw = Asgi(app, store, principal=lambda r: "c-1", listeners=[seen.append])
    transport = httpx.ASGITransport(app=mw)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        ran = await c.post("/api/v1/orders/7/pay", headers={"Idempotency-Key": "k-1"})
        again = await c.post("/api/v1/orders/7/pay", headers={"Idempotency-Key": "k-1"})
        keyless = await c.post("/api/v1/orders/8/pay")
        nowhere = await c.post("/api/v2/x", headers={"Idempotency-Key": "k-2"})
    await store.close()
    assert [ran.status_code, again.status_code, keyless.status_code] == [201, 201, 400]
    assert nowhere.status_code == 404
    label = "http:POST /api/v1/orders/{order}/pay"
    assert [(e.scope, e.kind.value) for e in seen] == [
        (label, "completed"), (label, "replayed"),
        ("http:POST <unmatched>", "completed"),
    ]  # fmt: skip
