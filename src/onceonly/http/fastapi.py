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

from fastapi import Depends, Header

from onceonly._core.http import Requirement, RouteRule
from onceonly.http._common import MARKER, idempotency
from onceonly.http.asgi import IdempotencyMiddleware

__all__ = ["IdempotencyMiddleware", "idempotency", "idempotency_key"]

_DOC = (
    "A unique key per operation (a UUID): a retry with the same key and body gets the "
    "first response again, marked Idempotent-Replayed: true."
)


def idempotency_key(
    required: bool = True, *, wait: float = 0.0, header: str = "Idempotency-Key"
) -> Any:
    """A ``Depends`` for ``dependencies=[...]``: the header in the schema, the rule for
    the middleware (required: missing key → 400; else optional).

    Args:
        required: whether requests must carry the header.
        wait: seconds a duplicate waits for the request in progress before 409.
        header: the header name (match the middleware's ``HttpPolicy.header``).

    .. versionadded:: 0.2
    """
    if required:
        annotation: Any = Annotated[str, Header(alias=header, description=_DOC)]
        default: Any = inspect.Parameter.empty
    else:
        annotation = Annotated[str | None, Header(alias=header, description=_DOC)]
        default = None

    async def dependency(**kwargs: Any) -> Any:
        return kwargs["idempotency_key"]

    dependency.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                "idempotency_key",
                inspect.Parameter.KEYWORD_ONLY,
                default=default,
                annotation=annotation,
            )
        ]
    )
    rule = RouteRule(Requirement.REQUIRED if required else Requirement.OPTIONAL, wait)
    setattr(dependency, MARKER, rule)
    return Depends(dependency)
