# SPDX-License-Identifier: MIT
"""Flask: ``OnceOnly(app, store=..., principal=...)`` installs the WSGI middleware with
Flask's own routing, so keys are scoped by the rule (``/orders/<int:id>``) and views
marked with :func:`onceonly.http.idempotency` get their rule (docs/http.md).

Needs the ``flask`` extra.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, request
from werkzeug.exceptions import HTTPException
from werkzeug.routing import RequestRedirect

from onceonly._core.http import RouteRule
from onceonly.errors import ConfigurationError
from onceonly.http._common import idempotency, rule_of
from onceonly.http.wsgi import Environ, IdempotencyMiddleware, Resolver
from onceonly.inbox import Tx
from onceonly.types import Store

__all__ = ["OnceOnly", "current_tx", "idempotency"]


def current_tx() -> Tx:
    """The transaction of the running atomic view (``@idempotency("required", atomic=True)``).

    Its writes (``tx.execute``, ``tx.publish``) and the stored response commit together.

    Raises:
        ConfigurationError: not inside an atomic view behind :class:`OnceOnly`.

    .. versionadded:: 0.2
    """
    tx = request.environ.get("onceonly.tx")
    if not isinstance(tx, Tx):
        raise ConfigurationError(
            "current_tx() runs only in a view marked @idempotency('required', atomic=True) "
            "of an app with OnceOnly(app, ...)"
        )
    return tx


def flask_resolver(app: Flask) -> Resolver:
    """Finds the Flask rule serving a request and the rule marked on its view."""

    def resolve(environ: Environ) -> tuple[str, RouteRule | None] | None:
        adapter = app.url_map.bind_to_environ(environ)
        try:
            rule, _ = adapter.match(return_rule=True)
        except (HTTPException, RequestRedirect):
            return None
        return rule.rule, rule_of(app.view_functions.get(rule.endpoint))

    return resolve


class OnceOnly:
    """The Flask extension: ``OnceOnly(app, store=store, principal=...)`` or ``init_app``.

    Args:
        app: the Flask app (or ``None``, then call :meth:`init_app`).
        store: a sync store (:func:`onceonly.open_store`).
        principal: who sends a request, from an :class:`~onceonly.http.HttpRequest`
            (it runs before Flask's request context: read headers or ``raw``, the
            environ).
        **options: ``routes``, ``default``, ``policy``, ``ttl``, ``lease``,
            ``max_attempts`` of :class:`onceonly.http.wsgi.IdempotencyMiddleware`.

    .. versionadded:: 0.2
    """

    def __init__(
        self, app: Flask | None = None, *, store: Store, principal: Any, **options: Any
    ) -> None:
        self.store = store
        self.principal = principal
        self.options = options
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Wrap ``app.wsgi_app`` in the idempotency middleware."""
        app.wsgi_app = IdempotencyMiddleware(  # type: ignore[method-assign]
            app.wsgi_app,
            self.store,
            principal=self.principal,
            resolver=flask_resolver(app),
            **self.options,
        )
        app.extensions["onceonly"] = self
