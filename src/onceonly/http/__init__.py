# SPDX-License-Identifier: MIT
"""HTTP idempotency: the ``Idempotency-Key`` header for ASGI and WSGI apps (docs/http.md).

``onceonly.http.asgi.IdempotencyMiddleware`` and ``onceonly.http.wsgi.IdempotencyMiddleware``
are the drivers (leased mode, any store); ``onceonly.http.fastapi`` and
``onceonly.http.flask`` add the framework helpers; ``scope_user`` (Starlette's
authentication) and ``remote_user`` (WSGI ``REMOTE_USER``) are principal callables. This
package imports no framework.
"""

from onceonly._core.http import (
    PROBLEM_TYPE_BASE,
    HttpPolicy,
    Problem,
    Requirement,
    RouteRule,
    StoredResponse,
)
from onceonly.http._common import HttpRequest, idempotency
from onceonly.http._principals import remote_user, scope_user

__all__ = [
    "HttpPolicy",
    "HttpRequest",
    "PROBLEM_TYPE_BASE",
    "Problem",
    "Requirement",
    "RouteRule",
    "StoredResponse",
    "idempotency",
    "remote_user",
    "scope_user",
]
