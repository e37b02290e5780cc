# SPDX-License-Identifier: MIT
"""ASGI 3 ``IdempotencyMiddleware``: leased mode over any async store (docs/http.md).

The driver of :mod:`onceonly._core.http`: it reads the body, claims the key with the
leased runner (a lease on the store's clock and a fencing token, renewed while the
handler runs), buffers the response, stores it fenced by the token, then sends it. The
store write runs in its own task shielded from cancellation, so a client that hangs up
does not lose the stored response; a crash leaves a lease that the next retry reclaims.
Needs an asyncio event loop.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from onceonly import _acompat
from onceonly._core import http as core
from onceonly._core.state import Write, complete_write
from onceonly.errors import DeadLettered, InFlight, PayloadMismatch, StoreUnavailable
from onceonly.events import EventHook, HttpEvents, Listener
from onceonly.http import _atomic
from onceonly.http._common import HttpRequest, Principal, Settings, log, problem_for, rule_of
from onceonly.leased_async import AsyncClaim, AsyncLeasedRunner, Replay
from onceonly.types import AsyncStore

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


def _starlette_route(scope: Scope, app: object) -> Any:
    """The Starlette/FastAPI route (not a mount) that will serve the request, if any."""
    router = getattr(scope.get("app", app), "router", None)
    routes = getattr(router, "routes", None)
    for route in routes or ():
        if not hasattr(route, "endpoint") or not hasattr(route, "path"):
            continue  # a Mount or a Host: its path is a prefix, not one route
        try:
            match, _ = route.matches(scope)
        except Exception:
            continue
        if getattr(match, "name", "") == "FULL":
            return route
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


class _Capture:
    """Buffers a storable response; passes anything else straight to the client."""

    def __init__(self, send: Send, policy: core.HttpPolicy) -> None:
        self._send = send
        self.policy = policy
        self.start: Message | None = None
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.chunks: list[bytes] = []
        self.size = 0
        self.passing = False
        self.complete = False
        self.reason: str | None = "the handler sent no response"

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.start = message
            self.status = int(message["status"])
            self.headers = [
                (n.decode("latin-1").lower(), v.decode("latin-1"))
                for n, v in message.get("headers", ())
            ]
            ok, self.reason = core.should_store(self.status, dict(self.headers), self.policy)
            if not ok:
                self.passing = True
                await self._send(message)
            return
        if kind != "http.response.body" or self.passing:
            await self._send(message)
            return
        self.chunks.append(bytes(message.get("body", b"")))
        self.size += len(self.chunks[-1])
        more = bool(message.get("more_body", False))
        if self.size > self.policy.max_response_bytes:
            self.reason = f"!the response is over the {self.policy.max_response_bytes} byte limit"
            self.passing = True
            await self.flush(more)
            return
        if not more:
            self.complete = True

    async def flush(self, more: bool = False) -> None:
        """Send the buffered response to the client."""
        assert self.start is not None
        await self._send(self.start)
        body = b"".join(self.chunks)
        self.chunks = []
        await self._send({"type": "http.response.body", "body": body, "more_body": more})

    def stored(self) -> core.StoredResponse:
        return core.StoredResponse(
            self.status, core.kept_headers(self.headers, self.policy), b"".join(self.chunks)
        )


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
        listeners: event listeners (:mod:`onceonly.events`): one event per keyed
            request, its ``scope`` the method and route template (``http:POST
            /orders/{id}``), never the principal, the path or the key.

    .. versionadded:: 0.2
    .. versionchanged:: 0.3
        ``listeners``.
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
        listeners: Iterable[Listener] = (),
    ) -> None:
        self.app = app
        self.store = store
        self.events = EventHook(listeners)
        self.settings = Settings(
            principal=principal,
            routes=routes,
            default=default,
            policy=policy,
            ttl=ttl,
            lease=lease,
            max_attempts=max_attempts,
        )
        self._tasks: set[asyncio.Task[Any]] = set()

    def _route(self, scope: Scope, method: str, path: str) -> tuple[str, core.RouteRule]:
        found = _starlette_route(scope, self.app)
        listed = self.settings.table_rule(method, path)
        template = str(found.path) if found is not None else (listed or (path, None))[0]
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
        method, path = str(scope["method"]), str(scope["path"])
        route, rule = self._route(scope, method, path)
        headers = _headers(scope)
        principal = None
        if policy.header.lower() in headers and rule.requirement is not core.Requirement.OFF:
            principal = self.settings.principal(HttpRequest(method, path, route, headers, scope))
        step = core.plan(method, route, headers, principal, rule, policy)
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
        query = bytes(scope.get("query_string", b""))
        fp = core.request_fingerprint(method, path, query, body, headers, policy, rule)
        seen = HttpEvents(self.events, method, self._label(scope, method, path, route), step.key)
        if rule.atomic:
            answer = await _atomic.run_asgi(
                self.app, self.store, self.settings, rule, step, fp, scope, _once(body, receive),
                [seen.relabel(listener) for listener in self.events.listeners],
            )  # fmt: skip
            await _send_response(send, *answer)
            return
        runner = AsyncLeasedRunner(
            self.store,
            scope=step.scope,
            policy=self.settings.lease,
            ttl=self.settings.ttl,
            wait=rule.wait,
        )
        try:
            got = await runner.claim(step.key, fp)
        except (PayloadMismatch, InFlight, DeadLettered, StoreUnavailable) as exc:
            seen.refused(exc)
            await _send_problem(send, problem_for(exc, policy.header))
            return
        if isinstance(got, Replay):
            seen.replayed()
            stored = core.decode_response(got.record)
            await _send_response(send, stored.status, core.replay_headers(stored), stored.body)
            return
        await self._run(scope, body, receive, send, runner, got, seen)

    def _label(self, scope: Scope, method: str, path: str, route: str) -> str | None:
        """``route`` when a template matched (the events' label), else ``None``."""
        if not self.events or route != path:
            return route
        matched = self.settings.table_rule(method, path) or _starlette_route(scope, self.app)
        return route if matched else None

    async def _run(
        self,
        scope: Scope,
        body: bytes,
        receive: Receive,
        send: Send,
        runner: AsyncLeasedRunner,
        claim: AsyncClaim,
        seen: HttpEvents,
    ) -> None:
        replay_receive = _once(body, receive)
        capture = _Capture(send, self.settings.policy)
        heartbeat = _acompat.AsyncHeartbeat(
            self.settings.lease.lease_seconds / 3,
            lambda: runner._renew(claim),
        )
        heartbeat.start()
        seen.started(claim.attempt)
        try:
            await self.app(scope, replay_receive, capture.send)
        except BaseException as exc:
            seen.raised(exc)
            await heartbeat.stop()
            reason = f"the handler raised {type(exc).__name__}"
            await self._finish(runner, claim, core.release_write(claim.record, reason))
            raise
        await heartbeat.stop()
        if capture.complete and not capture.passing:
            text = core.encode_response(capture.stored())
            await self._finish(runner, claim, complete_write(claim.record, text, runner.ttl))
            seen.stored(claim.attempt)
            await capture.flush()
            return
        reason = capture.reason or "the response was not stored"
        seen.not_stored(reason.lstrip("!"))
        if reason.startswith("!"):
            reason = reason[1:]
            log.warning("%s/%s: %s; the key is released", claim.scope, claim.key, reason)
        await self._finish(runner, claim, core.release_write(claim.record, reason))

    async def _finish(self, runner: AsyncLeasedRunner, claim: AsyncClaim, write: Write) -> None:
        """Store the end of the run in a task that a cancelled request does not stop."""
        task = asyncio.ensure_future(runner._final_write(claim, write))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            done = await asyncio.shield(task)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s/%s: storing the response failed", claim.scope, claim.key)
            return
        if done is None:
            log.warning("%s/%s: the lease was lost; nothing stored", claim.scope, claim.key)
