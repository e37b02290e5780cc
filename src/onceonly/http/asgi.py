# SPDX-License-Identifier: MIT
"""ASGI 3 ``IdempotencyMiddleware``: leased mode over any async store (docs/http.md).

The ASGI adapter of the HTTP flow (:mod:`onceonly.http._flow_async`): it reads the body,
lets the flow claim the key, buffers the response and, when the app sends its **last**
body chunk, lets the flow settle the key and then sends the answer. Whatever the app
does after that (Starlette background tasks) runs after the client has its response and
never changes what is stored. The flow's writes run in tasks shielded from cancellation,
so a client that hangs up does not lose the stored response; a crash leaves a lease
that the next retry reclaims. Needs an asyncio event loop.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, TypeVar

from onceonly._core import http as core
from onceonly.events import Listener
from onceonly.http import _atomic
from onceonly.http._common import (
    DEFAULT_FINAL_WRITE_BUDGET,
    HttpRequest,
    Principal,
    Settings,
    rule_of,
)
from onceonly.http._flow_async import Answer, AsyncExchange, AsyncHttpFlow
from onceonly.types import AsyncStore

T = TypeVar("T")

__all__ = ["IdempotencyMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _headers(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        n, v = name.decode("latin-1").lower(), value.decode("latin-1")
        out[n] = f"{out[n]}, {v}" if n in out else v
    return out


def _fields(scope: Scope, header: str) -> int:
    """How many header fields named ``header`` (lower-case) the request carries."""
    wanted = header.encode("latin-1")
    return sum(1 for name, _ in scope.get("headers", ()) if bytes(name).lower() == wanted)


def _starlette_route(scope: Scope, app: object) -> tuple[str, Any] | None:
    """The Starlette/FastAPI route that will serve the request and its whole template
    (the prefixes of the Mount routes it sits in, then its own path), if any."""
    router = getattr(scope.get("app", app), "router", None)
    return _find_route(getattr(router, "routes", None), scope, "", 0)


def _find_route(routes: Any, scope: Scope, prefix: str, depth: int) -> tuple[str, Any] | None:
    for route in routes or ():
        path = getattr(route, "path", None)
        if not isinstance(path, str):
            continue  # a Host: no path to label the route with
        try:
            match, child = route.matches(scope)
        except Exception:
            continue
        if getattr(match, "name", "") != "FULL":
            continue
        if hasattr(route, "endpoint"):
            return prefix + path, route
        inner = getattr(route, "routes", None)
        if not inner or depth >= 8:
            return None
        # a Mount: the router stops at it, and its routes see the scope it makes
        return _find_route(inner, {**scope, **child}, prefix + path, depth + 1)
    return None


def _once(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body already read, then the real one."""
    given = False

    async def replay_receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay_receive


async def _send_response(
    send: Send, status: int, headers: list[tuple[str, str]], body: bytes
) -> None:
    raw = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_problem(send: Send, problem: core.Problem) -> None:
    await _send_response(send, problem.status, problem.headers(), problem.body())


Shield = Callable[[Awaitable[Any]], Awaitable[Any]]


class _Capture:
    """The app's ``send``: buffers a storable response until its last chunk, then lets
    the exchange settle the key and sends the answer; passes anything else through."""

    def __init__(self, send: Send, exchange: AsyncExchange, shield: Shield) -> None:
        self._send = send
        self.exchange = exchange
        self.shield = shield
        self.start: Message | None = None
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.chunks: list[bytes] = []
        self.size = 0
        self.passing = False  # the response goes to the client as the app sends it
        self.answered = False  # the client got its answer: drop what the app sends

    async def send(self, message: Message) -> None:
        if self.answered:
            return
        if self.passing:
            await self._send(message)
            return
        kind = message["type"]
        if kind == "http.response.start":
            self.start = message
            self.status = int(message["status"])
            self.headers = [
                (n.decode("latin-1").lower(), v.decode("latin-1"))
                for n, v in message.get("headers", ())
            ]
            reason = self.exchange.storable(self.status, self.headers)
            if reason is not None:
                await self._not_stored(reason, more=True)
            return
        if kind != "http.response.body":
            await self._send(message)
            return
        self.chunks.append(bytes(message.get("body", b"")))
        self.size += len(self.chunks[-1])
        more = bool(message.get("more_body", False))
        reason = self.exchange.over_limit(self.size)
        if reason is not None:
            await self._not_stored(reason, more=more)
            return
        if not more:
            body = b"".join(self.chunks)
            answer = await self.shield(self.exchange.store(self.status, self.headers, body))
            await self._answer(answer, more=False)

    async def _not_stored(self, reason: str, more: bool) -> None:
        answer = await self.shield(self.exchange.not_stored(reason))
        self.passing = answer is None
        await self._answer(answer, more)

    async def _answer(self, answer: Answer | None, more: bool) -> None:
        """Send ``answer``, or the app's own response buffered so far."""
        if answer is not None:
            self.answered = True
            await _send_response(self._send, *answer)
            return
        self.answered = not more
        assert self.start is not None
        await self._send(self.start)
        if self.chunks or not more:
            body = b"".join(self.chunks)
            self.chunks = []
            await self._send({"type": "http.response.body", "body": body, "more_body": more})


class IdempotencyMiddleware:
    """ASGI 3 middleware honouring the ``Idempotency-Key`` header (leased mode).

    Args:
        app: the ASGI application.
        store: an async store (:func:`onceonly.open_async_store`).
        principal: who sends a request (user id, API key id, tenant), from an
            :class:`~onceonly.http.HttpRequest`; ``None`` when unknown. Keys are scoped
            by it, and a request with a key but no principal is refused (403) unless
            ``policy.anonymous == "pass"``.
        routes: ``{"/orders/{id}": "required", "PATCH /users/{id}": "off", …}``;
            ``RouteRule(requirement, wait=seconds)`` for a bounded wait on a request in
            progress. Starlette/FastAPI routes and endpoints marked with
            :func:`onceonly.http.idempotency` are found without it.
        default: the rule of routes not listed (``"optional"``).
        policy: header name, methods, stored headers, limits (:class:`HttpPolicy`).
        ttl: how long a response is replayed (default 24 hours).
        lease: how long a crashed request blocks its key before a retry runs it again.
        max_attempts: crashed runs of one key before it answers 409 ``key-exhausted``.
        final_write_budget: the most time storing a response may take in all (store
            outages included) before the client gets the response anyway.
        listeners: event listeners (:mod:`onceonly.events`): one event per keyed
            request, its ``scope`` the method and route template (``http:POST
            /orders/{id}``), never the principal, the path or the key.

    .. versionadded:: 0.2
    .. versionchanged:: 0.3 ``listeners``.
    .. versionchanged:: 0.4 ``final_write_budget``.
    """

    def __init__(
        self,
        app: ASGIApp,
        store: AsyncStore,
        *,
        principal: Principal,
        routes: dict[str, object] | None = None,
        default: object = "optional",
        policy: core.HttpPolicy | None = None,
        ttl: dt.timedelta | float | None = dt.timedelta(hours=24),
        lease: dt.timedelta | float = dt.timedelta(seconds=30),
        max_attempts: int = 5,
        final_write_budget: dt.timedelta | float = DEFAULT_FINAL_WRITE_BUDGET,
        listeners: Iterable[Listener] = (),
    ) -> None:
        self.app = app
        self.store = store
        self.settings = Settings(
            principal=principal,
            routes=routes,
            default=default,
            policy=policy,
            ttl=ttl,
            lease=lease,
            max_attempts=max_attempts,
            final_write_budget=final_write_budget,
            listeners=listeners,
        )
        self.flow = AsyncHttpFlow(store, self.settings)
        self._tasks: set[asyncio.Task[Any]] = set()

    def _route(self, scope: Scope, method: str, path: str) -> tuple[str | None, core.RouteRule]:
        """The matched route template (``None``: no route matched) and the rule."""
        matched = _starlette_route(scope, self.app)
        found = matched[1] if matched is not None else None
        listed = self.settings.table_rule(method, path)
        template = matched[0] if matched is not None else (listed or (None, None))[0]
        if listed is not None:
            return template, listed[1]
        if found is not None:
            marked = rule_of(found.endpoint)
            for dep in getattr(found, "dependencies", None) or ():
                marked = marked or rule_of(getattr(dep, "dependency", None))
            dependant = getattr(found, "dependant", None)
            for sub in getattr(dependant, "dependencies", None) or ():
                marked = marked or rule_of(getattr(sub, "call", None))
            if marked is not None:
                return template, marked
        return template, self.settings.default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        policy = self.settings.policy
        if scope["type"] != "http" or scope["method"] not in policy.methods:
            await self.app(scope, receive, send)
            return
        method = str(scope["method"])
        root = str(scope.get("root_path", ""))
        # the identity's path holds the mount prefix; rules and labels are the app's
        concrete = core.concrete_path(root, str(scope["path"]), may_hold_prefix=True)
        prefix = root.rstrip("/")
        path = (concrete[len(prefix) :] or "/") if prefix else concrete
        route, rule = self._route(scope, method, path)
        headers = _headers(scope)
        principal = None
        if policy.header.lower() in headers and rule.requirement is not core.Requirement.OFF:
            request = HttpRequest(method, path, route or path, headers, scope)
            principal = self.settings.principal(request)
        fields = _fields(scope, policy.header.lower())
        step = core.plan(method, route or path, headers, principal, rule, policy, key_fields=fields)
        if isinstance(step, core.Pass):
            await self.app(scope, receive, send)
            return
        if isinstance(step, core.Problem):
            await _send_problem(send, step)
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its body: nothing ran
            chunks.append(bytes(message.get("body", b"")))
            size += len(chunks[-1])
            more = bool(message.get("more_body", False))
            if size > policy.max_request_bytes:
                detail = f"requests carrying a key are limited to {policy.max_request_bytes} bytes"
                await _send_problem(send, core.problem("request-too-large", detail))
                return
        body = b"".join(chunks)
        keyed = self.flow.identify(
            step,
            rule,
            method=method,
            route=route,
            path=concrete,
            query=bytes(scope.get("query_string", b"")),
            body=body,
            headers=headers,
        )
        if rule.atomic:
            await _atomic.run_asgi(
                self.app,
                self.store,
                self.settings,
                rule,
                step,
                keyed.fingerprint,
                scope,
                _once(body, receive),
                send,
                keyed.inbox_listeners,
            )
            return
        got = await self.flow.begin(keyed)
        if not isinstance(got, AsyncExchange):
            await _send_response(send, *got)
            return
        capture = _Capture(send, got, self._shielded)
        try:
            await self.app(scope, _once(body, receive), capture.send)
        except BaseException as exc:
            if not got.ended:
                await self._shielded(got.raised(exc))
            raise  # after the answer (a background task): the server logs it
        if not got.ended:
            # the app returned without ending its response: nothing to store
            await self._shielded(got.not_stored("the handler ended without a whole response"))

    async def _shielded(self, step: Awaitable[T]) -> T:
        """Await ``step`` in a task that a cancelled request (a hang-up) does not stop."""
        task = asyncio.ensure_future(step)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)
