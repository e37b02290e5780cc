# SPDX-License-Identifier: MIT
"""Django ``IdempotencyMiddleware``: the Django driver of :mod:`onceonly._core.http`.

Leased mode by default, through the one HTTP flow (:mod:`onceonly.http._flow`): the
claim commits with a lease, the view runs, the response is stored fenced by the token
within the final-write budget before it is returned. Atomic mode for views marked
``atomic=True``: the claim joins ``transaction.atomic()`` on the default database, so
the view's ORM writes and the stored response commit together; a response of 400 or
more (``Http404``, ``PermissionDenied`` turned into one) rolls the view's writes back.
Sync and async views (an async view runs through Django's own sync adapter).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.urls import Resolver404, resolve
from django.utils.module_loading import import_string

from onceonly._core import http as core
from onceonly.contrib.django.apps import OnceOnlyConfig, options
from onceonly.contrib.django.views import TX_ATTRIBUTE
from onceonly.errors import (
    ConfigurationError,
    DeadLettered,
    InFlight,
    PayloadMismatch,
    StoreUnavailable,
)
from onceonly.http import _atomic
from onceonly.http._common import DEFAULT_FINAL_WRITE_BUDGET, Settings, log, problem_for, rule_of
from onceonly.http._flow import Exchange, HttpFlow, Keyed
from onceonly.inbox import Inbox, Tx

__all__ = ["IdempotencyMiddleware"]

_CLAIM_ERRORS = (PayloadMismatch, InFlight, DeadLettered, StoreUnavailable)


def _response(status: int, headers: list[tuple[str, str]], body: bytes) -> HttpResponse:
    response = HttpResponse(body, status=status)
    for name, value in headers:
        response.headers[name] = value
    return response


def _problem(problem: core.Problem) -> HttpResponse:
    return _response(problem.status, problem.headers(), problem.body())


def _parts(response: HttpResponseBase) -> tuple[int, list[tuple[str, str]], bytes]:
    body = getattr(response, "content", b"")
    headers = [(n.lower(), v) for n, v in response.headers.items()]
    if not any(n == "content-length" for n, _ in headers) and response.status_code not in (
        204,
        304,
    ):
        headers.append(("content-length", str(len(body))))
    return response.status_code, headers, body


def _key_fields(request: HttpRequest, header: str) -> int:
    """How many ``header`` fields the request carries: under ASGI, counted in the
    scope (Django joins them into one value); under WSGI the server joined them, 1."""
    scope = getattr(request, "scope", None)
    if not isinstance(scope, dict):
        return 1
    wanted = header.lower().encode("latin-1")
    return sum(1 for name, _ in scope.get("headers", ()) if bytes(name).lower() == wanted)


class IdempotencyMiddleware:
    """Honour the ``Idempotency-Key`` header (configured by ``settings.ONCEONLY_HTTP``).

    ``PRINCIPAL`` is a callable (or its dotted path) given the Django request (after the
    authentication middleware: ``request.user`` is there) and returning who calls, or
    ``None`` (then a keyed request is refused with 403).

    .. versionadded:: 0.2
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        from django.apps import apps

        self.get_response = get_response
        opts = options()
        principal = opts.get("PRINCIPAL")
        if isinstance(principal, str):
            principal = import_string(principal)
        if principal is None:
            raise ConfigurationError(
                "settings.ONCEONLY_HTTP['PRINCIPAL'] is required: a callable(request) "
                "returning the user id, API key id or tenant; keys are never shared"
            )
        self.principal: Callable[[HttpRequest], str | None] = principal
        self.settings = Settings(
            principal=lambda _request: None,  # the Django request goes to self.principal
            routes={k.lstrip("/"): v for k, v in opts.get("ROUTES", {}).items()},
            default=opts.get("DEFAULT", "optional"),
            policy=opts.get("POLICY"),
            ttl=opts.get("TTL", dt.timedelta(hours=24)),
            lease=opts.get("LEASE", dt.timedelta(seconds=30)),
            max_attempts=opts.get("MAX_ATTEMPTS", 5),
            final_write_budget=opts.get("FINAL_WRITE_BUDGET", DEFAULT_FINAL_WRITE_BUDGET),
            listeners=opts.get("LISTENERS", ()),
        )
        config = apps.get_app_config("onceonly")
        assert isinstance(config, OnceOnlyConfig)
        self.config = config

    def _route(self, request: HttpRequest) -> tuple[str | None, core.RouteRule]:
        """The matched route template (``None``: no URL pattern matched) and the rule."""
        try:
            match = resolve(request.path_info)
        except Resolver404:
            return None, self.settings.default
        template = str(match.route or request.path_info)
        rule = self.settings.routes.get(template) or rule_of(match.func) or self.settings.default
        return "/" + template.lstrip("/"), rule

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        policy = self.settings.policy
        method = str(request.method or "GET").upper()
        if method not in policy.methods:
            return self.get_response(request)
        route, rule = self._route(request)
        headers = {k.lower(): v for k, v in request.headers.items()}
        principal = None
        if policy.header.lower() in headers and rule.requirement is not core.Requirement.OFF:
            principal = self.principal(request)
        step = core.plan(
            method,
            route or request.path_info,
            headers,
            principal,
            rule,
            policy,
            key_fields=_key_fields(request, policy.header),
        )
        if isinstance(step, core.Pass):
            return self.get_response(request)
        if isinstance(step, core.Problem):
            return _problem(step)
        length = int(request.META.get("CONTENT_LENGTH") or 0)
        if length > policy.max_request_bytes:
            detail = f"requests carrying a key are limited to {policy.max_request_bytes} bytes"
            return _problem(core.problem("request-too-large", detail))
        flow = HttpFlow(self.config.store(), self.settings)
        keyed = flow.identify(
            step,
            rule,
            method=method,
            route=route,
            path=request.path,  # the script prefix (SCRIPT_NAME, root_path) included
            query=str(request.META.get("QUERY_STRING", "")),
            body=request.body,
            headers=headers,
        )
        if rule.atomic:
            return self._atomic(request, keyed)
        got = flow.begin(keyed)
        if not isinstance(got, Exchange):
            return _response(*got)
        return self._run(request, got)

    def _run(self, request: HttpRequest, exchange: Exchange) -> HttpResponseBase:
        try:
            response = self.get_response(request)
        except BaseException as exc:
            exchange.raised(exc)
            raise
        if response.streaming:
            reason: str | None = "!a streamed response is not kept"
        else:
            status, out, content = _parts(response)
            reason = exchange.storable(status, out) or exchange.over_limit(len(content))
        if reason is not None:
            answer = exchange.not_stored(reason)
            if answer is None:
                return response
            response.close()
            return _response(*answer)
        answer = exchange.store(status, out, content)
        if answer is not None:
            return _response(*answer)
        return response

    def _atomic(self, request: HttpRequest, keyed: Keyed) -> HttpResponseBase:
        store = self.config.store()
        step = keyed.step
        options = _atomic.inbox_options(
            store, step, self.settings, keyed.rule, keyed.fingerprint, keyed.inbox_listeners
        )
        inbox = Inbox(store, **options)
        policy = self.settings.policy
        seen: list[HttpResponseBase] = []

        def handler(_payload: object, tx: Tx) -> dict[str, object]:
            setattr(request, TX_ATTRIBUTE, tx)
            tx.execute(f"SAVEPOINT {_atomic.SAVEPOINT}")
            response = self.get_response(request)
            seen.append(response)
            if _atomic.refused(response.status_code):
                tx.execute(f"ROLLBACK TO SAVEPOINT {_atomic.SAVEPOINT}")
            tx.execute(f"RELEASE SAVEPOINT {_atomic.SAVEPOINT}")
            if response.streaming:
                raise _atomic.NotStored("!a streamed response is not stored")
            status, out, content = _parts(response)
            _atomic.check_stored(status, out, len(content), policy)
            kept = core.kept_headers(out, policy)
            return core.response_doc(core.StoredResponse(status, kept, content))

        try:
            with transaction.atomic(using=DEFAULT_DB_ALIAS):
                # atomic() connected and turned autocommit off: the claim's savepoint
                # opens the transaction (psycopg 3 or psycopg2 send BEGIN first; Django
                # begins it itself on SQLite)
                raw: Any = connections[DEFAULT_DB_ALIAS].connection
                got = inbox.process(step.key, None, handler, connection=raw)
        except (_atomic.NotStored, _atomic.Redirected) as exc:
            if exc.reason.startswith("!"):
                log.warning("%s/%s: %s; rolled back", step.scope, step.key, exc.reason[1:])
                detail = exc.reason[1:] + "; nothing was committed"
                return _problem(core.problem("response-not-stored", detail))
            return seen[-1]
        except _CLAIM_ERRORS as exc:
            return _problem(problem_for(exc, policy.header))
        if got.replayed:
            stored = core.response_from_doc(got.result, step.scope, step.key)
            return _response(stored.status, core.replay_headers(stored), stored.body)
        return seen[-1]
