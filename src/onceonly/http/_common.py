# SPDX-License-Identifier: MIT
"""What the ASGI and WSGI drivers share: settings, the request view, route markers."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from onceonly._core import http as core
from onceonly._core.durations import seconds
from onceonly._core.state import Policy
from onceonly.errors import (
    ConfigurationError,
    DeadLettered,
    InFlight,
    OnceOnlyError,
    PayloadMismatch,
    StoreUnavailable,
)
from onceonly.events import EventHook, Listener

__all__ = ["HttpRequest", "Principal", "Settings", "idempotency", "problem_for", "rule_of"]

log = logging.getLogger("onceonly.http")

F = TypeVar("F", bound=Callable[..., Any])

MARKER = "__onceonly_route__"

DEFAULT_FINAL_WRITE_BUDGET = 5.0
"""Seconds the response's final write may take in all before the client gets its answer."""

IN_FLIGHT_RETRY_AFTER = 2.0
"""The longest ``Retry-After`` of a 409 ``in-flight`` (a request usually ends long before
its lease would lapse)."""


@dataclass(frozen=True)
class HttpRequest:
    """What the principal callable sees of a request.

    Attributes:
        method: upper-case method.
        path: the request path.
        route: the route template (``/orders/{id}``) when known, else the path.
        headers: lower-case header names to values (repeated headers joined by ``", "``).
        raw: the ASGI scope or the WSGI environ, for anything else (an authenticated
            user set by earlier middleware, a client certificate, …).

    .. versionadded:: 0.2
    """

    method: str
    path: str
    route: str
    headers: Mapping[str, str]
    raw: Mapping[str, Any]


Principal = Callable[[HttpRequest], "str | None"]
"""Who sends a request (user id, API key id, tenant), or ``None`` when unknown."""


def coerce_rule(rule: object) -> core.RouteRule:
    """A :class:`RouteRule` from a rule, a requirement or its name."""
    if isinstance(rule, core.RouteRule):
        return rule
    try:
        return core.RouteRule(core.Requirement(rule))
    except ValueError:
        raise ConfigurationError(
            f"{rule!r} is not a route rule: use 'required', 'optional', 'off' or RouteRule(...)"
        ) from None


def idempotency(
    requirement: str = "required",
    *,
    wait: float = 0.0,
    atomic: bool = False,
    rerun_unstored: bool = False,
    body_fields: tuple[str, ...] | None = None,
    ignore_fields: tuple[str, ...] = (),
) -> Callable[[F], F]:
    """Mark a view or endpoint with its :class:`~onceonly.http.RouteRule`.

    The middleware reads the mark on Starlette/FastAPI endpoints and Flask views.

    Args:
        requirement: ``"required"`` (no key: 400), ``"optional"`` or ``"off"``.
        wait: seconds a duplicate waits for the request in progress before 409.
        atomic: atomic mode (SQL stores): the handler's writes through ``tx`` and the
            stored response commit together (Flask: ``onceonly.http.flask.current_tx()``).
        rerun_unstored: a response that cannot be kept (a stream, over the size limit)
            gives the key back so a retry runs again, instead of completing the key
            (duplicates: 409 ``replay-unavailable``).
        body_fields: the only JSON body fields that count in the fingerprint
            (:class:`~onceonly.http.RouteRule`).
        ignore_fields: JSON body fields that do not count in the fingerprint.

    Returns:
        A decorator returning the function itself, marked.

    .. versionadded:: 0.2
    """
    rule = core.RouteRule(
        core.Requirement(requirement),
        wait,
        atomic,
        rerun_unstored=rerun_unstored,
        body_fields=body_fields,
        ignore_fields=ignore_fields,
    )

    def mark(fn: F) -> F:
        setattr(fn, MARKER, rule)
        return fn

    return mark


def rule_of(endpoint: object) -> core.RouteRule | None:
    """The rule marked on ``endpoint`` with :func:`idempotency`, if any."""
    rule = getattr(endpoint, MARKER, None)
    return rule if isinstance(rule, core.RouteRule) else None


class Settings:
    """The options both middlewares take, checked once."""

    def __init__(
        self,
        *,
        principal: Principal,
        routes: Mapping[str, object] | None,
        default: object,
        policy: core.HttpPolicy | None,
        ttl: dt.timedelta | float | None,
        lease: dt.timedelta | float,
        max_attempts: int,
        final_write_budget: dt.timedelta | float = DEFAULT_FINAL_WRITE_BUDGET,
        listeners: Iterable[Listener] = (),
    ) -> None:
        if not callable(principal):
            raise ConfigurationError(
                "principal= must be a callable returning who sends the request (user id, "
                "API key id, tenant) or None; keys are never shared between principals"
            )
        self.principal = principal
        self.routes = {k: coerce_rule(v) for k, v in (routes or {}).items()}
        self.default = coerce_rule(default)
        self.policy = policy or core.HttpPolicy()
        self.ttl = None if ttl is None else seconds(ttl, what="ttl")
        self.lease = Policy(seconds(lease, what="lease"), max_attempts)
        self.final_write_budget = seconds(final_write_budget, what="final_write_budget")
        self.events = EventHook(listeners)

    def table_rule(self, method: str, path: str) -> tuple[str, core.RouteRule] | None:
        """The route template and rule the ``routes`` table gives ``method path``."""
        if not self.routes:
            return None
        for template, rule in self.routes.items():
            head, _, tail = template.partition(" ")
            if tail and head.upper() == method and core.match_route([tail], path):
                return tail, rule
        for template, rule in self.routes.items():
            if template.startswith("/") and core.match_route([template], path):
                return template, rule
        return None


def problem_for(exc: OnceOnlyError, header: str) -> core.Problem:
    """The problem answering a claim that could not be taken."""
    if isinstance(exc, PayloadMismatch):
        return core.problem(
            "key-mismatch",
            f"this {header} was already used with another request (method, path, query, "
            "body or a fingerprinted header); "
            "use a new key for a new request",
        )
    if isinstance(exc, InFlight):
        return core.problem(
            "in-flight",
            "the first request with this key has not finished; retry later",
            retry_after=min(exc.retry_after or 1.0, IN_FLIGHT_RETRY_AFTER),
        )
    if isinstance(exc, DeadLettered):
        return core.problem("key-exhausted", "use a new key")
    if isinstance(exc, StoreUnavailable):
        return core.problem("store-unavailable", "retry later", retry_after=1.0)
    raise exc
