# SPDX-License-Identifier: MIT
"""Atomic mode for HTTP (SQL stores): the request runs as an inbox handler.

The claim, every write the handler makes through ``tx`` (``scope["onceonly.tx"]`` /
``environ["onceonly.tx"]``) and the stored response commit in one transaction; a response
that is not stored (5xx, 429, …) rolls all of it back and is sent as it is. A response
that cannot be stored (a stream, over the limit) rolls back too and the client gets 500
``response-not-stored``: the handler's effects never commit without their response. A
server that dies mid-request commits nothing, so the retry runs on a clean slate.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any

from onceonly._core import http as core
from onceonly.errors import (
    ConfigurationError,
    DeadLettered,
    InFlight,
    PayloadMismatch,
    StoreUnavailable,
)
from onceonly.events import Listener
from onceonly.http._common import Settings, log, problem_for
from onceonly.inbox import Inbox, Tx
from onceonly.inbox_async import AsyncInbox, AsyncTx

__all__ = ["run_asgi", "run_wsgi"]

TX_KEY = "onceonly.tx"
_CLAIM_ERRORS = (PayloadMismatch, InFlight, DeadLettered, StoreUnavailable)


class _NotStored(Exception):
    """Raised inside the inbox handler to roll the transaction back."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _options(
    store: object, step: core.Proceed, settings: Settings, rule: core.RouteRule, fp: str
) -> dict[str, Any]:
    if not getattr(store, "atomic", False):
        raise ConfigurationError(
            f"atomic HTTP routes need a SQL store, not {type(store).__name__}; "
            "drop atomic=True to use leased mode"
        )
    return {
        "consumer": step.scope,
        "ttl": settings.ttl,
        "wait": max(rule.wait, 0.05),
        "max_attempts": settings.lease.max_attempts,
        "fingerprint": lambda _payload: fp,
        "keep_payload": False,
        "max_result_bytes": 8 * settings.policy.max_response_bytes + 65536,
    }


def _check(status: int, headers: list[tuple[str, str]], size: int, policy: core.HttpPolicy) -> None:
    """Raise :class:`_NotStored` unless this response is stored."""
    ok, reason = core.should_store(status, {n.lower(): v for n, v in headers}, policy)
    if ok and size > policy.max_response_bytes:
        ok, reason = False, f"!the response is over the {policy.max_response_bytes} byte limit"
    if not ok:
        raise _NotStored(reason or "not stored")


class _Response:
    """The response the app produced, buffered whole."""

    def __init__(self) -> None:
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.chunks: list[bytes] = []

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def doc(self, policy: core.HttpPolicy) -> dict[str, object]:
        _check(self.status, self.headers, len(self.body), policy)
        kept = core.kept_headers(self.headers, policy)
        return core.response_doc(core.StoredResponse(self.status, kept, self.body))


def _answer(
    got: Any, step: core.Proceed, response: _Response
) -> tuple[int, list[tuple[str, str]], bytes]:
    if got.replayed:
        stored = core.response_from_doc(got.result, step.scope, step.key)
        return stored.status, core.replay_headers(stored), stored.body
    return response.status, response.headers, response.body


def _not_stored(
    exc: _NotStored, step: core.Proceed, response: _Response
) -> tuple[int, list[tuple[str, str]], bytes]:
    if not exc.reason.startswith("!"):
        return response.status, response.headers, response.body
    log.warning("%s/%s: %s; rolled back", step.scope, step.key, exc.reason[1:])
    problem = core.problem("response-not-stored", exc.reason[1:] + "; nothing was committed")
    return problem.status, problem.headers(), problem.body()


async def run_asgi(
    app: Any,
    store: Any,
    settings: Settings,
    rule: core.RouteRule,
    step: core.Proceed,
    fp: str,
    scope: MutableMapping[str, Any],
    receive: Callable[[], Any],
    listeners: Iterable[Listener] = (),
) -> tuple[int, list[tuple[str, str]], bytes]:
    """Run the ASGI ``app`` in atomic mode; the answer to send."""
    inbox = AsyncInbox(store, **_options(store, step, settings, rule, fp), listeners=listeners)
    response = _Response()

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            response.status = int(message["status"])
            response.headers = [
                (n.decode("latin-1").lower(), v.decode("latin-1"))
                for n, v in message.get("headers", ())
            ]
        elif message["type"] == "http.response.body":
            response.chunks.append(bytes(message.get("body", b"")))

    async def handler(_payload: object, tx: AsyncTx) -> dict[str, object]:
        response.chunks.clear()
        await app({**scope, TX_KEY: tx}, receive, send)
        return response.doc(settings.policy)

    try:
        got = await inbox.process(step.key, None, handler)
    except _NotStored as exc:
        return _not_stored(exc, step, response)
    except _CLAIM_ERRORS as exc:
        problem = problem_for(exc, settings.policy.header)
        return problem.status, problem.headers(), problem.body()
    return _answer(got, step, response)


def run_wsgi(
    app: Any, store: Any, settings: Settings, rule: core.RouteRule, step: core.Proceed, fp: str,
    environ: dict[str, Any], listeners: Iterable[Listener] = (),
) -> tuple[int, list[tuple[str, str]], bytes]:  # fmt: skip
    """Run the WSGI ``app`` in atomic mode; the answer to return."""
    inbox = Inbox(store, **_options(store, step, settings, rule, fp), listeners=listeners)
    response = _Response()
    body = environ["wsgi.input"].read()

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        response.status = int(status.split(" ", 1)[0])
        response.headers = list(headers)
        return response.chunks.append

    def handler(_payload: object, tx: Tx) -> dict[str, object]:
        response.chunks.clear()
        result: Iterable[bytes] = app(
            {**environ, TX_KEY: tx, "wsgi.input": io.BytesIO(body)}, start_response
        )
        try:
            response.chunks.extend(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        return response.doc(settings.policy)

    try:
        got = inbox.process(step.key, None, handler)
    except _NotStored as exc:
        return _not_stored(exc, step, response)
    except _CLAIM_ERRORS as exc:
        problem = problem_for(exc, settings.policy.header)
        return problem.status, problem.headers(), problem.body()
    return _answer(got, step, response)
