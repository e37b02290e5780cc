# SPDX-License-Identifier: MIT
"""WSGI ``IdempotencyMiddleware``: leased mode over any sync store (docs/http.md).

The sync driver of :mod:`onceonly._core.http`, twin of :mod:`onceonly.http.asgi`: the
body is read and handed back to the app, the key claimed with the leased runner (lease
renewed while the app runs), the response buffered, stored fenced by the token, then
returned. The whole response is stored before the server writes a byte of it, so a
client that hangs up cannot lose it; a crash leaves a lease the next retry reclaims.
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Callable, Iterable, Iterator, Mapping
from http import HTTPStatus
from typing import Any

from onceonly import _acompat
from onceonly._core import http as core
from onceonly._core.state import Write, complete_write
from onceonly.errors import DeadLettered, InFlight, PayloadMismatch, StoreUnavailable
from onceonly.events import EventHook, HttpEvents, Listener
from onceonly.http import _atomic
from onceonly.http._common import HttpRequest, Principal, Settings, log, problem_for
from onceonly.leased import Claim, LeasedRunner, Replay
from onceonly.types import Store

__all__ = ["IdempotencyMiddleware", "Resolver"]

Environ = dict[str, Any]
StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]
Resolver = Callable[[Environ], "tuple[str, core.RouteRule | None] | None"]
"""Finds a request's route template (and the rule marked on its view) from the environ."""


def _headers(environ: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in environ.items():
        if name.startswith("HTTP_"):
            out[name[5:].replace("_", "-").lower()] = str(value)
        elif name in ("CONTENT_TYPE", "CONTENT_LENGTH") and value:
            out[name.replace("_", "-").lower()] = str(value)
    return out


def _respond(
    start_response: StartResponse, status: str, headers: list[tuple[str, str]], body: bytes
) -> list[bytes]:
    start_response(status, headers)
    return [body]


def _problem(start_response: StartResponse, problem: core.Problem) -> list[bytes]:
    status = f"{problem.status} {_reason(problem.status)}".strip()
    return _respond(start_response, status, problem.headers(), problem.body())


def _close(result: Iterable[bytes]) -> None:
    close = getattr(result, "close", None)
    if close is not None:
        close()


class _Stream:
    """The rest of a response that is not stored, passed through."""

    def __init__(self, buffered: list[bytes], rest: Iterator[bytes], result: Iterable[bytes]):
        self.buffered, self.rest, self.result = buffered, rest, result

    def __iter__(self) -> Iterator[bytes]:
        yield from self.buffered
        yield from self.rest

    def close(self) -> None:
        _close(self.result)


class IdempotencyMiddleware:
    """WSGI middleware honouring the ``Idempotency-Key`` header (leased mode).

    Args:
        app: the WSGI application.
        store: a sync store (:func:`onceonly.open_store`).
        principal: who sends a request, from an :class:`~onceonly.http.HttpRequest`
            (``raw`` is the environ); ``None`` when unknown (then 403, see
            :class:`~onceonly.http.HttpPolicy` ``anonymous``).
        routes, default, policy, ttl, lease, max_attempts: as for the ASGI
            :class:`onceonly.http.asgi.IdempotencyMiddleware`.
        resolver: finds the route template and marked rule of a request (the Flask
            extension passes one); otherwise ``routes`` or the path is used.
        listeners: event listeners, as for the ASGI middleware.

    .. versionadded:: 0.2
    .. versionchanged:: 0.3
        ``listeners``.
    """

    def __init__(
        self,
        app: WSGIApp,
        store: Store,
        *,
        principal: Principal,
        routes: dict[str, object] | None = None,
        default: object = "optional",
        policy: core.HttpPolicy | None = None,
        ttl: dt.timedelta | float | None = dt.timedelta(hours=24),
        lease: dt.timedelta | float = dt.timedelta(seconds=30),
        max_attempts: int = 5,
        resolver: Resolver | None = None,
        listeners: Iterable[Listener] = (),
    ) -> None:
        self.app = app
        self.store = store
        self.events = EventHook(listeners)
        self.resolver = resolver
        self.settings = Settings(
            principal=principal,
            routes=routes,
            default=default,
            policy=policy,
            ttl=ttl,
            lease=lease,
            max_attempts=max_attempts,
        )

    def _route(self, environ: Environ, method: str, path: str) -> tuple[str, core.RouteRule]:
        found = self.resolver(environ) if self.resolver is not None else None
        listed = self.settings.table_rule(method, path)
        template = found[0] if found is not None else (listed or (path, None))[0]
        if listed is not None:
            return template, listed[1]
        if found is not None and found[1] is not None:
            return template, found[1]
        return template, self.settings.default

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        policy = self.settings.policy
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        if method not in policy.methods:
            return self.app(environ, start_response)
        path = str(environ.get("PATH_INFO", "")) or "/"
        route, rule = self._route(environ, method, path)
        headers = _headers(environ)
        principal = None
        if policy.header.lower() in headers and rule.requirement is not core.Requirement.OFF:
            request = HttpRequest(method, path, route, headers, environ)
            principal = self.settings.principal(request)
        step = core.plan(method, route, headers, principal, rule, policy)
        if isinstance(step, core.Pass):
            return self.app(environ, start_response)
        if isinstance(step, core.Problem):
            return _problem(start_response, step)
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        stream = environ["wsgi.input"]
        limit = policy.max_request_bytes
        body = stream.read(length) if length else b""
        if not length and environ.get("wsgi.input_terminated"):
            body = stream.read(limit + 1)
        if len(body) > limit:
            detail = f"requests carrying a key are limited to {limit} bytes"
            return _problem(start_response, core.problem("request-too-large", detail))
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        query = str(environ.get("QUERY_STRING", ""))
        fp = core.request_fingerprint(method, path, query, body, headers, policy, rule)
        seen = HttpEvents(self.events, method, self._label(environ, method, path, route), step.key)
        if rule.atomic:
            code, out, content = _atomic.run_wsgi(
                self.app, self.store, self.settings, rule, step, fp, environ,
                [seen.relabel(listener) for listener in self.events.listeners],
            )  # fmt: skip
            return _respond(start_response, f"{code} {_reason(code)}".strip(), out, content)
        runner = LeasedRunner(
            self.store,
            scope=step.scope,
            policy=self.settings.lease,
            ttl=self.settings.ttl,
            wait=rule.wait,
        )
        try:
            got = runner.claim(step.key, fp)
        except (PayloadMismatch, InFlight, DeadLettered, StoreUnavailable) as exc:
            seen.refused(exc)
            return _problem(start_response, problem_for(exc, policy.header))
        if isinstance(got, Replay):
            seen.replayed()
            stored = core.decode_response(got.record)
            status = f"{stored.status} {_reason(stored.status)}".strip()
            return _respond(start_response, status, core.replay_headers(stored), stored.body)
        return self._run(environ, start_response, runner, got, seen)

    def _label(self, environ: Environ, method: str, path: str, route: str) -> str | None:
        """``route`` when a template matched (the events' label), else ``None``."""
        if not self.events or route != path:
            return route
        found = self.resolver(environ) if self.resolver is not None else None
        return route if found or self.settings.table_rule(method, path) else None

    def _run(
        self,
        environ: Environ,
        start_response: StartResponse,
        runner: LeasedRunner,
        claim: Claim,
        seen: HttpEvents,
    ) -> Iterable[bytes]:
        policy = self.settings.policy
        started: list[tuple[str, list[tuple[str, str]]]] = []
        written: list[bytes] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            started[:] = [(status, list(headers))]
            return written.append

        heartbeat = _acompat.Heartbeat(
            self.settings.lease.lease_seconds / 3, lambda: runner._renew(claim)
        )
        heartbeat.start()
        buffered: list[bytes] = []
        reason: str | None = None
        seen.started(claim.attempt)
        try:
            result = self.app(environ, capture)
            rest = iter(result)
            size = 0
            for chunk in rest:
                if written:
                    buffered.extend(written)
                    written.clear()
                buffered.append(chunk)
                size += len(chunk)
                reason = self._refusal(started, size)
                if reason is not None:
                    break
            else:
                buffered.extend(written)
                reason = self._refusal(started, sum(map(len, buffered)))
        except BaseException as exc:
            seen.raised(exc)
            heartbeat.stop()
            self._finish(runner, claim, core.release_write(claim.record, type(exc).__name__))
            raise
        status, headers = started[0] if started else ("500 Internal Server Error", [])
        if reason is not None:
            seen.not_stored(reason.lstrip("!"))
            if reason.startswith("!"):
                reason = reason[1:]
                log.warning("%s/%s: %s; the key is released", claim.scope, claim.key, reason)
            # nothing will be stored: give the key back now, not when the server closes
            heartbeat.stop()
            self._finish(runner, claim, core.release_write(claim.record, reason))
            start_response(status, headers)
            return _Stream(buffered, rest, result)
        _close(result)
        heartbeat.stop()
        body = b"".join(buffered)
        code = int(status.split(" ", 1)[0])
        stored = core.StoredResponse(code, core.kept_headers(headers, policy), body)
        text = core.encode_response(stored)
        self._finish(runner, claim, complete_write(claim.record, text, runner.ttl))
        seen.stored(claim.attempt)
        start_response(status, headers)
        return [body]

    def _refusal(self, started: list[tuple[str, list[tuple[str, str]]]], size: int) -> str | None:
        """Why the response begun in ``started`` is not stored (``None``: it is)."""
        if not started:
            return "the app sent no status"
        status, headers = started[0]
        code = int(status.split(" ", 1)[0])
        names = {n.lower(): v for n, v in headers}
        ok, reason = core.should_store(code, names, self.settings.policy)
        if ok and size > self.settings.policy.max_response_bytes:
            return f"!the response is over the {self.settings.policy.max_response_bytes} limit"
        return None if ok else reason

    def _finish(self, runner: LeasedRunner, claim: Claim, write: Write) -> None:
        try:
            done = runner._final_write(claim, write)
        except Exception:
            log.exception("%s/%s: storing the response failed", claim.scope, claim.key)
            return
        if done is None:
            log.warning("%s/%s: the lease was lost; nothing stored", claim.scope, claim.key)


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""
