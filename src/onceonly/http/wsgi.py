# SPDX-License-Identifier: MIT
"""WSGI ``IdempotencyMiddleware``: leased mode over any sync store (docs/http.md).

The WSGI adapter of the HTTP flow (:mod:`onceonly.http._flow`), twin of
:mod:`onceonly.http.asgi`: the body is read (never past ``max_request_bytes``) and handed
back to the app, the flow claims the key, the response is buffered and the flow settles
the key before the server writes a byte of it, so a client that hangs up cannot lose
it; a crash leaves a lease the next retry reclaims.
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Callable, Iterable, Iterator, Mapping
from http import HTTPStatus
from typing import Any

from onceonly._core import http as core
from onceonly.events import Listener
from onceonly.http import _atomic
from onceonly.http._common import DEFAULT_FINAL_WRITE_BUDGET, HttpRequest, Principal, Settings
from onceonly.http._flow import Answer, Exchange, HttpFlow
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


_READ_SIZE = 64 * 1024


def _read_body(environ: Environ, limit: int) -> bytes | None:
    """The whole request body, or ``None`` when it is over ``limit`` bytes.

    ``read(n)`` may return fewer bytes than asked (a chunked request through an
    unbuffered stream gives one chunk per call), so the body is read until
    ``CONTENT_LENGTH`` bytes came or the stream ends; without a length, only an input
    the server terminates (``wsgi.input_terminated``) is read, to its end. A declared
    length over ``limit`` is refused unread; an undeclared one is read no further than
    one byte past it.
    """
    try:
        length: int | None = int(environ.get("CONTENT_LENGTH") or "")
    except ValueError:
        length = None
    if length is not None and length > limit:
        return None  # refused unread
    if length is None and not environ.get("wsgi.input_terminated"):
        length = 0  # PEP 3333: nothing may be read past a missing CONTENT_LENGTH
    stream = environ["wsgi.input"]
    wanted = limit + 1 if length is None else length
    chunks: list[bytes] = []
    size = 0
    while size < wanted:
        chunk = stream.read(min(_READ_SIZE, wanted - size))
        if not chunk:
            break  # the end of the input (a client that sent less than it declared)
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:
        return None
    return b"".join(chunks)


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
        routes: as for the ASGI :class:`onceonly.http.asgi.IdempotencyMiddleware`.
        default: as for the ASGI :class:`onceonly.http.asgi.IdempotencyMiddleware`.
        policy: as for the ASGI :class:`onceonly.http.asgi.IdempotencyMiddleware`.
        ttl: as for the ASGI :class:`onceonly.http.asgi.IdempotencyMiddleware`.
        lease: as for the ASGI :class:`onceonly.http.asgi.IdempotencyMiddleware`.
        max_attempts: as for the ASGI :class:`onceonly.http.asgi.IdempotencyMiddleware`.
        final_write_budget: as for the ASGI :class:`onceonly.http.asgi.IdempotencyMiddleware`.
        resolver: finds the route template and marked rule of a request (the Flask
            extension passes one); otherwise ``routes`` or the path is used.
        listeners: event listeners, as for the ASGI middleware.

    .. versionadded:: 0.2
    .. versionchanged:: 0.3 ``listeners``.
    .. versionchanged:: 0.4 ``final_write_budget``.
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
        final_write_budget: dt.timedelta | float = DEFAULT_FINAL_WRITE_BUDGET,
        listeners: Iterable[Listener] = (),
    ) -> None:
        self.app = app
        self.store = store
        self.resolver = resolver
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
        self.flow = HttpFlow(store, self.settings)

    def _route(self, environ: Environ, method: str, path: str) -> tuple[str | None, core.RouteRule]:
        """The matched route template (``None``: no route matched) and the rule."""
        found = self.resolver(environ) if self.resolver is not None else None
        listed = self.settings.table_rule(method, path)
        template = found[0] if found is not None else (listed or (None, None))[0]
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
        # the identity's path holds the mount prefix; rules and labels are the app's
        concrete = core.concrete_path(str(environ.get("SCRIPT_NAME", "")), path)
        route, rule = self._route(environ, method, path)
        headers = _headers(environ)
        principal = None
        if policy.header.lower() in headers and rule.requirement is not core.Requirement.OFF:
            request = HttpRequest(method, path, route or path, headers, environ)
            principal = self.settings.principal(request)
        step = core.plan(method, route or path, headers, principal, rule, policy)
        if isinstance(step, core.Pass):
            return self.app(environ, start_response)
        if isinstance(step, core.Problem):
            return _problem(start_response, step)
        limit = policy.max_request_bytes
        body = _read_body(environ, limit)
        if body is None:
            too_large = core.problem(
                "request-too-large", f"requests carrying a key are limited to {limit} bytes"
            )
            return _problem(start_response, too_large)
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        keyed = self.flow.identify(
            step,
            rule,
            method=method,
            route=route,
            path=concrete,
            query=str(environ.get("QUERY_STRING", "")),
            body=body,
            headers=headers,
        )
        if rule.atomic:
            code, out, content = _atomic.run_wsgi(
                self.app, self.store, self.settings, rule, step, keyed.fingerprint, environ,
                keyed.inbox_listeners,
            )  # fmt: skip
            return _respond(start_response, f"{code} {_reason(code)}".strip(), out, content)
        got = self.flow.begin(keyed)
        if not isinstance(got, Exchange):
            return _answer(start_response, got)
        return self._run(environ, start_response, got)

    def _run(
        self, environ: Environ, start_response: StartResponse, exchange: Exchange
    ) -> Iterable[bytes]:
        started: list[tuple[str, list[tuple[str, str]]]] = []
        written: list[bytes] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            started[:] = [(status, list(headers))]
            return written.append

        buffered: list[bytes] = []
        reason: str | None = None
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
                reason = self._refusal(exchange, started, size)
                if reason is not None:
                    break
            else:
                buffered.extend(written)
                reason = self._refusal(exchange, started, sum(map(len, buffered)))
        except BaseException as exc:
            exchange.raised(exc)
            raise
        status, headers = started[0] if started else ("500 Internal Server Error", [])
        if reason is not None:
            # nothing will be stored: settle the key now, before a byte is sent
            answer = exchange.not_stored(reason)
            if answer is not None:
                _close(result)
                return _answer(start_response, answer)
            start_response(status, headers)
            return _Stream(buffered, rest, result)
        _close(result)
        body = b"".join(buffered)
        code = int(status.split(" ", 1)[0])
        answer = exchange.store(code, [(n.lower(), v) for n, v in headers], body)
        if answer is not None:
            return _answer(start_response, answer)
        start_response(status, headers)
        return [body]

    def _refusal(
        self, exchange: Exchange, started: list[tuple[str, list[tuple[str, str]]]], size: int
    ) -> str | None:
        """Why the response begun in ``started`` is not stored (``None``: it is)."""
        if not started:
            return "the app sent no status"
        status, headers = started[0]
        reason = exchange.storable(int(status.split(" ", 1)[0]), headers)
        return reason if reason is not None else exchange.over_limit(size)


def _answer(start_response: StartResponse, answer: Answer) -> list[bytes]:
    code, headers, body = answer
    return _respond(start_response, f"{code} {_reason(code)}".strip(), headers, body)


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""
