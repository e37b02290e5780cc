# SPDX-License-Identifier: MIT
"""FastAPI: a route dependency that declares the ``Idempotency-Key`` header in the OpenAPI
schema and tells the ASGI middleware the route's rule (docs/http.md)::

    app.add_middleware(IdempotencyMiddleware, store=store, principal=...)

    @app.post("/orders", dependencies=[idempotency_key(required=True)])
    async def create_order(order: Order) -> ...: ...

Needs the ``fastapi`` extra.
"""

# no ``from __future__ import annotations``: FastAPI reads the dependency's annotations
import inspect
from typing import Annotated, Any

from fastapi import Depends, Header, Request

from onceonly._core.http import Requirement, RouteRule
from onceonly.errors import ConfigurationError
from onceonly.http._common import MARKER, idempotency
from onceonly.http.asgi import IdempotencyMiddleware
from onceonly.inbox import AsyncTx

__all__ = ["IdempotencyMiddleware", "idempotency", "idempotency_key", "idempotent_tx"]

_DOC = (
    "A unique key per operation (a UUID): a retry with the same key and body gets the "
    "first response again, marked Idempotent-Replayed: true."
)


def idempotency_key(
    required: bool = True,
    *,
    wait: float = 0.0,
    header: str = "Idempotency-Key",
    body_fields: tuple[str, ...] | None = None,
    ignore_fields: tuple[str, ...] = (),
) -> Any:
    """A ``Depends`` for ``dependencies=[...]``: the header in the schema, the rule for
    the middleware (required: missing key → 400; else optional).

    Args:
        required: whether requests must carry the header.
        wait: seconds a duplicate waits for the request in progress before 409.
        header: the header name (match the middleware's ``HttpPolicy.header``).
        body_fields: the only JSON body fields that count in the fingerprint
            (:class:`~onceonly.http.RouteRule`).
        ignore_fields: JSON body fields that do not count in the fingerprint.

    .. versionadded:: 0.2
    """
    if required:
        annotation: Any = Annotated[str, Header(alias=header, description=_DOC)]
        default: Any = inspect.Parameter.empty
    else:
        annotation = Annotated[str | None, Header(alias=header, description=_DOC)]
        default = None

    async def dependency(**kwargs: Any) -> Any:
        return kwargs["idempotency_key"]  # the request is for the signature only

    _declare(dependency, annotation, default)
    requirement = Requirement.REQUIRED if required else Requirement.OPTIONAL
    rule = RouteRule(requirement, wait, body_fields=body_fields, ignore_fields=ignore_fields)
    setattr(dependency, MARKER, rule)
    return Depends(dependency)


def _declare(fn: Any, annotation: Any, default: Any) -> None:
    """Give ``fn`` the signature ``(request, *, idempotency_key: annotation = default)``."""
    fn.__signature__ = inspect.Signature(
        [
            inspect.Parameter(
                "request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request
            ),
            inspect.Parameter(
                "idempotency_key",
                inspect.Parameter.KEYWORD_ONLY,
                default=default,
                annotation=annotation,
            ),
        ]
    )


def idempotent_tx(*, wait: float = 0.0, header: str = "Idempotency-Key") -> Any:
    """Atomic mode: ``tx: Annotated[AsyncTx, idempotent_tx()]`` on an endpoint yields the
    transaction holding the key's claim (SQL stores; the header is required).

    The handler's writes through ``tx`` (``await tx.execute(...)``, ``tx.publish``) and
    the stored response commit in one transaction, or none of them does: a 5xx, an
    exception or a crash leaves nothing behind, and a replay returns the stored response
    without running the handler.

    Args:
        wait: seconds a duplicate waits for the transaction in progress before 409.
        header: the header name (match the middleware's ``HttpPolicy.header``).

    Raises:
        ConfigurationError: the route runs without the middleware, or on a store that
            cannot hold a transaction (then use leased mode).

    .. versionadded:: 0.2
    """

    async def dependency(**kwargs: Any) -> AsyncTx:
        tx = kwargs["request"].scope.get("onceonly.tx")
        if not isinstance(tx, AsyncTx):
            raise ConfigurationError(
                "idempotent_tx() needs onceonly.http.asgi.IdempotencyMiddleware on the app"
            )
        return tx

    _declare(
        dependency, Annotated[str, Header(alias=header, description=_DOC)], inspect.Parameter.empty
    )
    setattr(dependency, MARKER, RouteRule(Requirement.REQUIRED, wait, atomic=True))
    return Depends(dependency)
