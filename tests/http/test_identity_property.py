# SPDX-License-Identifier: MIT
"""Property: two requests with one key that differ in exactly one component (path
parameter, query, body, method, principal, a fingerprinted header) never share a
response. The second is 422 ``key-mismatch``, or, for another principal, a fresh run.
Through the raw WSGI middleware (werkzeug's client) and the raw ASGI middleware (httpx),
on the memory store.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import httpx
from flask import Flask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import onceonly
from onceonly.http import HttpPolicy
from onceonly.http.asgi import IdempotencyMiddleware as AsgiMiddleware
from onceonly.http.wsgi import IdempotencyMiddleware as WsgiMiddleware

POLICY = HttpPolicy(methods=frozenset({"POST", "PATCH", "PUT"}), fingerprint_headers=("x-region",))
ROUTES = {"/orders/{id}/pay": "required"}
COMPONENTS = ["path", "query", "body", "method", "principal", "header"]

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)
scalars = st.one_of(st.integers(-(2**60), 2**60), text, st.booleans(), st.none())
requests = st.fixed_dictionaries(
    {
        "order": st.integers(0, 10**6),
        "query": st.dictionaries(st.text("abcxyz", min_size=1, max_size=3), text, max_size=3),
        "body": st.dictionaries(st.text("abcdef", min_size=1, max_size=3), scalars, max_size=4),
        "method": st.sampled_from(["POST", "PATCH", "PUT"]),
        "principal": st.sampled_from(["alice", "bob", "42"]),
        "region": st.sampled_from(["eu", "us", "ap"]),
    }
)


@st.composite
def pairs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any], str]:
    """A request, the one component changed, and that component's name."""
    first = draw(requests)
    what = draw(st.sampled_from(COMPONENTS))
    second = dict(first)
    if what == "path":
        second["order"] = draw(st.integers(0, 10**6).filter(lambda o: o != first["order"]))
    elif what == "query":
        key = draw(st.text("abcxyz", min_size=1, max_size=3))
        value = draw(text.filter(lambda v: first["query"].get(key) != v))
        second["query"] = {**first["query"], key: value}
    elif what == "body":
        key = draw(st.text("abcdef", min_size=1, max_size=3))
        # a different JSON value: 1 and 1.0 and True are not told apart by type here
        value = draw(
            scalars.filter(
                lambda v: json.dumps(first["body"].get(key, ...), default=str) != json.dumps(v)
            )
        )
        second["body"] = {**first["body"], key: value}
    elif what == "method":
        second["method"] = draw(
            st.sampled_from(["POST", "PATCH", "PUT"]).filter(lambda m: m != first["method"])
        )
    elif what == "principal":
        second["principal"] = draw(
            st.sampled_from(["alice", "bob", "42"]).filter(lambda p: p != first["principal"])
        )
    else:
        second["region"] = draw(
            st.sampled_from(["eu", "us", "ap"]).filter(lambda r: r != first["region"])
        )
    return first, second, what  # fmt: skip


def target(req: dict[str, Any]) -> str:
    query = urlencode(req["query"])
    return f"/orders/{req['order']}/pay" + (f"?{query}" if query else "")


def headers(req: dict[str, Any], key: str) -> dict[str, str]:
    return {
        "Idempotency-Key": key,
        "X-User": req["principal"],
        "X-Region": req["region"],
        "Content-Type": "application/json",
    }


def check(first: Any, second: Any, what: str, runs_before: int, runs_after: int) -> None:
    """``(status, replayed header, body)`` of the two answers."""
    assert first[0] == 201 and first[1] is None
    if what == "principal":
        assert second[0] == 201 and second[1] is None, second
        assert runs_after == runs_before + 2 and second[2] != first[2]
    else:
        assert second[0] == 422 and second[1] is None, (what, second)
        assert b"key-mismatch" in second[2] and runs_after == runs_before + 1


def counting_wsgi(runs: list[int]) -> Callable[..., Any]:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        runs.append(1)
        out = json.dumps({"n": len(runs)}).encode()
        start_response("201 Created", [("Content-Length", str(len(out)))])
        return [out]

    return app


WSGI_RUNS: list[int] = []
WSGI = Flask(__name__)
WSGI.wsgi_app = WsgiMiddleware(  # type: ignore[method-assign]
    counting_wsgi(WSGI_RUNS),
    onceonly.open_store("memory://"),
    principal=lambda r: r.headers.get("x-user"),
    routes=ROUTES,
    policy=POLICY,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs())
def test_wsgi_one_component_apart_is_never_a_replay(
    pair: tuple[dict[str, Any], dict[str, Any], str],
) -> None:
    """WSGI: a request one component apart from the first, same key, is never its replay."""
    first, second, what = pair
    key = uuid.uuid4().hex
    client = WSGI.test_client()
    before = len(WSGI_RUNS)
    answers = []
    for req in (first, second):
        r = client.open(
            target(req), method=req["method"], data=json.dumps(req["body"]),
            headers=headers(req, key),
        )  # fmt: skip
        answers.append((r.status_code, r.headers.get("Idempotent-Replayed"), r.data))
    check(answers[0], answers[1], what, before, len(WSGI_RUNS))


ASGI_RUNS: list[int] = []


async def counting_asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    ASGI_RUNS.append(1)
    out = json.dumps({"n": len(ASGI_RUNS)}).encode()
    start = [(b"content-length", b"%d" % len(out))]
    await send({"type": "http.response.start", "status": 201, "headers": start})
    await send({"type": "http.response.body", "body": out})


ASGI = AsgiMiddleware(
    counting_asgi,
    onceonly.open_async_store("memory://"),
    principal=lambda r: r.headers.get("x-user"),
    routes=ROUTES,
    policy=POLICY,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs())
def test_asgi_one_component_apart_is_never_a_replay(
    pair: tuple[dict[str, Any], dict[str, Any], str],
) -> None:
    """ASGI: a request one component apart from the first, same key, is never its replay."""
    first, second, what = pair
    key = uuid.uuid4().hex

    async def both() -> list[tuple[int, str | None, bytes]]:
        transport = httpx.ASGITransport(app=ASGI)
        out = []
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            for req in (first, second):
                r = await c.request(
                    req["method"], target(req), content=json.dumps(req["body"]).encode(),
                    headers=headers(req, key),
                )  # fmt: skip
                out.append((r.status_code, r.headers.get("idempotent-replayed"), r.content))
        return out

    before = len(ASGI_RUNS)
    answers = asyncio.run(both())
    check(answers[0], answers[1], what, before, len(ASGI_RUNS))
