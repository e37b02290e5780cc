# SPDX-License-Identifier: MIT
"""Atomic mode for HTTP (SQL stores): the request runs as an inbox handler.

The claim, every write the handler makes through ``tx`` (``scope["onceonly.tx"]`` /
``environ["onceonly.tx"]``) and the stored response commit in one transaction; a response
that is not stored (5xx, 429, …) rolls all of it back and is sent as it is (a 307/308
redirect records nothing at all, so the redirected request may use the key). A response
that cannot be stored (a stream, over the limit) rolls back too and the client gets 500
``response-not-stored``: the handler's effects never commit without their response. A
server that dies mid-request commits nothing, so the retry runs on a clean slate.

The handler runs inside a savepoint: a response of 400 or more (the framework turned
``HTTPException``, ``abort()`` or ``Http404`` into one before we see it) rolls the
handler's writes back, and a deterministic 4xx is still stored and replayed.

SQLite has one write lock for the whole database: a request that waits for it may wait
for another key's request. That wait has its own bound (:data:`LOCK_WAIT`), and running
out of it is answered 503 ``store-unavailable``, never 409 ``in-flight``.

ASGI: the transaction commits when the app sends its last body chunk, and the answer is
sent; only then does the app go on (Starlette background tasks), outside the
transaction, never changing what is stored.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
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
from onceonly.inbox import AsyncInbox, AsyncTx, Inbox, Tx
from onceonly.types import AsyncStore, Store

__all__ = [
    "NotStored",
    "Redirected",
    "check_stored",
    "inbox_options",
    "refused",
    "run_asgi",
    "run_wsgi",
]

TX_KEY = "onceonly.tx"
SAVEPOINT = "onceonly_handler"
LOCK_WAIT = 10.0
"""Seconds an atomic request waits for a database-wide write lock (SQLite)."""
_CLAIM_ERRORS = (PayloadMismatch, InFlight, DeadLettered, StoreUnavailable)


class NotStored(Exception):
    """Raised inside the inbox handler to roll the transaction back."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Redirected(BaseException):
    """Raised inside the inbox handler for a 307/308: not an ``Exception``, so the inbox
    rolls the run back, its claim with it, and records no failed attempt (the key stays
    free for the redirected request)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def inbox_options(
    store: Store | AsyncStore,
    step: core.Proceed,
    settings: Settings,
    rule: core.RouteRule,
    fp: str,
    listeners: Iterable[Listener] = (),
) -> dict[str, Any]:
    if not store.atomic:
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
        # the request's label (method + route template), not the record's scope
        "listeners": tuple(listeners),
    }


def _lock_inbox(options: dict[str, Any], exc: InFlight) -> dict[str, Any]:
    """The options of a second try after ``exc``: a database-wide lock (no key named, the
    SQLite write lock) waited for up to :data:`LOCK_WAIT`; a key in flight is re-raised."""
    if exc.key is not None:
        raise exc
    return {**options, "wait": max(options["wait"], LOCK_WAIT)}


def _lock_timeout(exc: InFlight) -> StoreUnavailable:
    return StoreUnavailable(
        f"the database write lock stayed held for {LOCK_WAIT} s (other requests are "
        f"writing); retry later: {exc}"
    )


def check_stored(
    status: int, headers: list[tuple[str, str]], size: int, policy: core.HttpPolicy
) -> None:
    """Raise :class:`NotStored` unless this response is stored."""
    ok, reason = core.should_store(status, {n.lower(): v for n, v in headers}, policy)
    if ok and size > policy.max_response_bytes:
        ok, reason = False, f"!the response is over the {policy.max_response_bytes} byte limit"
    if not ok and reason is not None and reason.startswith(core.REDIRECTED):
        raise Redirected(reason[1:])
    if not ok:
        raise NotStored(reason or "not stored")


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
        check_stored(self.status, self.headers, len(self.body), policy)
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
    exc: NotStored | Redirected, step: core.Proceed, response: _Response
) -> tuple[int, list[tuple[str, str]], bytes]:
    if not exc.reason.startswith("!"):
        return response.status, response.headers, response.body
    log.warning("%s/%s: %s; rolled back", step.scope, step.key, exc.reason[1:])
    problem = core.problem("response-not-stored", exc.reason[1:] + "; nothing was committed")
    return problem.status, problem.headers(), problem.body()


def refused(status: int) -> bool:
    """Whether a response with ``status`` rolls the handler's writes back (a refusal)."""
    return status >= 400


async def run_asgi(
    app: Any,
    store: Any,
    settings: Settings,
    rule: core.RouteRule,
    step: core.Proceed,
    fp: str,
    scope: MutableMapping[str, Any],
    receive: Callable[[], Any],
    send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    listeners: Iterable[Listener] = (),
) -> None:
    """Run the ASGI ``app`` in atomic mode and send the answer (see the module doc)."""
    options = inbox_options(store, step, settings, rule, fp, listeners)
    response = _Response()
    last = asyncio.Event()  # the app sent its last body chunk
    answered = asyncio.Event()  # the transaction ended and the answer was sent
    running: list[asyncio.Task[None]] = []

    async def capture(message: MutableMapping[str, Any]) -> None:
        if answered.is_set():
            return
        if message["type"] == "http.response.start":
            response.status = int(message["status"])
            response.headers = [
                (n.decode("latin-1").lower(), v.decode("latin-1"))
                for n, v in message.get("headers", ())
            ]
        elif message["type"] == "http.response.body":
            response.chunks.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                last.set()
                await answered.wait()  # the app goes on once the answer is out

    async def handler(_payload: object, tx: AsyncTx) -> dict[str, object]:
        response.chunks.clear()
        last.clear()
        await tx.execute(f"SAVEPOINT {SAVEPOINT}")
        task = asyncio.ensure_future(app({**scope, TX_KEY: tx}, receive, capture))
        running.append(task)
        ended = asyncio.ensure_future(last.wait())
        try:
            await asyncio.wait({task, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
        if not last.is_set():
            task.result()  # the app raised (rolls back) or returned without a response
        if refused(response.status):
            await tx.execute(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}")
        await tx.execute(f"RELEASE SAVEPOINT {SAVEPOINT}")
        return response.doc(settings.policy)

    try:
        try:
            try:
                got = await AsyncInbox(store, **options).process(step.key, None, handler)
            except InFlight as exc:
                slower = AsyncInbox(store, **_lock_inbox(options, exc))
                try:
                    got = await slower.process(step.key, None, handler)
                except InFlight as again:
                    raise _lock_timeout(again) if again.key is None else again from None
        except (NotStored, Redirected) as exc:
            answer = _not_stored(exc, step, response)
        except _CLAIM_ERRORS as exc:
            problem = problem_for(exc, settings.policy.header)
            answer = problem.status, problem.headers(), problem.body()
        else:
            answer = _answer(got, step, response)
        raw = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in answer[1]]
        await send({"type": "http.response.start", "status": answer[0], "headers": raw})
        await send({"type": "http.response.body", "body": answer[2], "more_body": False})
    finally:
        answered.set()
        for task in running:
            if not task.done() and not last.is_set():
                task.cancel()
    for task in running:
        await task  # background tasks: after the answer; their errors reach the server


def run_wsgi(
    app: Any, store: Any, settings: Settings, rule: core.RouteRule, step: core.Proceed, fp: str,
    environ: dict[str, Any], listeners: Iterable[Listener] = (),
) -> tuple[int, list[tuple[str, str]], bytes]:  # fmt: skip
    """Run the WSGI ``app`` in atomic mode; the answer to return."""
    options = inbox_options(store, step, settings, rule, fp, listeners)
    response = _Response()
    body = environ["wsgi.input"].read()

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        response.status = int(status.split(" ", 1)[0])
        response.headers = list(headers)
        return response.chunks.append

    def handler(_payload: object, tx: Tx) -> dict[str, object]:
        response.chunks.clear()
        tx.execute(f"SAVEPOINT {SAVEPOINT}")
        result: Iterable[bytes] = app(
            {**environ, TX_KEY: tx, "wsgi.input": io.BytesIO(body)}, start_response
        )
        try:
            response.chunks.extend(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        if refused(response.status):
            tx.execute(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}")
        tx.execute(f"RELEASE SAVEPOINT {SAVEPOINT}")
        return response.doc(settings.policy)

    try:
        try:
            got = Inbox(store, **options).process(step.key, None, handler)
        except InFlight as exc:
            try:
                got = Inbox(store, **_lock_inbox(options, exc)).process(step.key, None, handler)
            except InFlight as again:
                raise _lock_timeout(again) if again.key is None else again from None
    except (NotStored, Redirected) as exc:
        return _not_stored(exc, step, response)
    except _CLAIM_ERRORS as exc:
        problem = problem_for(exc, settings.policy.header)
        return problem.status, problem.headers(), problem.body()
    return _answer(got, step, response)
