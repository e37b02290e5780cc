# SPDX-License-Identifier: MIT
"""Django ``IdempotencyMiddleware``: the Django driver of :mod:`onceonly._core.http`.

Leased mode by default (the claim commits with a lease, the view runs, the response is
stored fenced by the token); atomic mode for views marked ``atomic=True`` (the claim
joins ``transaction.atomic()`` on the default database, so the view's ORM writes and
the stored response commit together). Sync views only.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.urls import Resolver404, resolve
from django.utils.module_loading import import_string

from onceonly import _acompat
from onceonly._core import http as core
from onceonly._core.state import complete_write
from onceonly.contrib.django.apps import OnceOnlyConfig, options
from onceonly.contrib.django.views import TX_ATTRIBUTE
from onceonly.errors import (
    ConfigurationError,
    DeadLettered,
    InFlight,
    PayloadMismatch,
    StoreUnavailable,
)
from onceonly.events import EventHook, HttpEvents
from onceonly.http import _atomic
from onceonly.http._common import Settings, log, problem_for, rule_of
from onceonly.inbox import Inbox, Tx
from onceonly.leased import LeasedRunner, Replay

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
        self.events = EventHook(opts.get("LISTENERS", ()))
        self.settings = Settings(
            principal=lambda _request: None,  # the Django request goes to self.principal
            routes={k.lstrip("/"): v for k, v in opts.get("ROUTES", {}).items()},
            default=opts.get("DEFAULT", "optional"),
            policy=opts.get("POLICY"),
            ttl=opts.get("TTL", dt.timedelta(hours=24)),
            lease=opts.get("LEASE", dt.timedelta(seconds=30)),
            max_attempts=opts.get("MAX_ATTEMPTS", 5),
        )
        config = apps.get_app_config("onceonly")
        assert isinstance(config, OnceOnlyConfig)
        self.config = config

    def _route(self, request: HttpRequest) -> tuple[str, core.RouteRule]:
        try:
            match = resolve(request.path_info)
        except Resolver404:
            return request.path_info, self.settings.default
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
        step = core.plan(method, route, headers, principal, rule, policy)
        if isinstance(step, core.Pass):
            return self.get_response(request)
        if isinstance(step, core.Problem):
            return _problem(step)
        length = int(request.META.get("CONTENT_LENGTH") or 0)
        if length > policy.max_request_bytes:
            detail = f"requests carrying a key are limited to {policy.max_request_bytes} bytes"
            return _problem(core.problem("request-too-large", detail))
        body = request.body
        query = str(request.META.get("QUERY_STRING", ""))
        fp = core.request_fingerprint(method, request.path_info, query, body, headers, policy, rule)
        label = route if route != "/" + request.path_info.lstrip("/") else None
        if label is None and self.events:
            try:
                resolve(request.path_info)
                label = route
            except Resolver404:
                pass
        seen = HttpEvents(self.events, method, label, step.key)
        if rule.atomic:
            return self._atomic(request, rule, step, fp, seen)
        runner = LeasedRunner(
            self.config.store(),
            scope=step.scope,
            policy=self.settings.lease,
            ttl=self.settings.ttl,
            wait=rule.wait,
        )
        try:
            got = runner.claim(step.key, fp)
        except _CLAIM_ERRORS as exc:
            seen.refused(exc)
            return _problem(problem_for(exc, policy.header))
        if isinstance(got, Replay):
            seen.replayed()
            stored = core.decode_response(got.record)
            return _response(stored.status, core.replay_headers(stored), stored.body)
        claim = got
        heartbeat = _acompat.Heartbeat(
            self.settings.lease.lease_seconds / 3, lambda: runner._renew(claim)
        )
        heartbeat.start()
        seen.started(claim.attempt)
        try:
            response = self.get_response(request)
        except BaseException as exc:
            seen.raised(exc)
            heartbeat.stop()
            runner._final_write(claim, core.release_write(claim.record, "the view raised"))
            raise
        heartbeat.stop()
        reason: str | None = "!a streamed response is not stored"
        if not response.streaming:
            status, out, content = _parts(response)
            _, reason = core.should_store(status, dict(out), policy)
        if reason is not None:
            seen.not_stored(reason.lstrip("!"))
            if reason.startswith("!"):
                reason = reason[1:]
                log.warning("%s/%s: %s; the key is released", claim.scope, claim.key, reason)
            runner._final_write(claim, core.release_write(claim.record, reason))
            return response
        stored = core.StoredResponse(status, core.kept_headers(out, policy), content)
        text = core.encode_response(stored)
        if runner._final_write(claim, complete_write(claim.record, text, runner.ttl)) is None:
            log.warning("%s/%s: the lease was lost; nothing stored", claim.scope, claim.key)
        seen.stored(claim.attempt)
        return response

    def _atomic(
        self,
        request: HttpRequest,
        rule: core.RouteRule,
        step: core.Proceed,
        fp: str,
        events: HttpEvents,
    ) -> HttpResponseBase:
        store = self.config.store()
        relabelled = [events.relabel(listener) for listener in self.events.listeners]
        options = _atomic._options(store, step, self.settings, rule, fp)
        inbox = Inbox(store, **options, listeners=relabelled)
        policy = self.settings.policy
        seen: list[HttpResponseBase] = []

        def handler(_payload: object, tx: Tx) -> dict[str, object]:
            setattr(request, TX_ATTRIBUTE, tx)
            response = self.get_response(request)
            seen.append(response)
            if response.streaming:
                raise _atomic._NotStored("!a streamed response is not stored")
            status, out, content = _parts(response)
            _atomic._check(status, out, len(content), policy)
            kept = core.kept_headers(out, policy)
            return core.response_doc(core.StoredResponse(status, kept, content))

        try:
            with transaction.atomic(using=DEFAULT_DB_ALIAS):
                # atomic() connected and turned autocommit off: the claim's savepoint
                # opens the transaction (psycopg 3 or psycopg2 send BEGIN first; Django
                # begins it itself on SQLite)
                raw: Any = connections[DEFAULT_DB_ALIAS].connection
                got = inbox.process(step.key, None, handler, connection=raw)
        except _atomic._NotStored as exc:
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
