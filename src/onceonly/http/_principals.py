# SPDX-License-Identifier: MIT
"""Principal callables for the HTTP middlewares: who sends a request, or ``None``.

A principal scopes the keys (docs/http.md, "Principal"): two clients never share a
stored response. Each callable here returns ``None`` for a client it cannot identify
(then a keyed request is refused with 403), never a constant text such as ``"None"``.
Django's are in :mod:`onceonly.contrib.django.principals`.

.. versionadded:: 0.3
"""

from __future__ import annotations

from onceonly.http._common import HttpRequest

__all__ = ["remote_user", "scope_user"]


def scope_user(request: HttpRequest) -> str | None:
    """The user Starlette's ``AuthenticationMiddleware`` put in the ASGI scope.

    Add ``AuthenticationMiddleware`` *outside* the idempotency middleware (with
    ``app.add_middleware``, after it), so the scope has its ``user`` when the key is
    claimed.

    Args:
        request: the request (``raw`` is the ASGI scope).

    Returns:
        ``user.identity`` (or ``user.display_name`` for users without an identity, such
        as Starlette's ``SimpleUser``) of an authenticated user; ``None`` for an
        unauthenticated one or when no authentication middleware ran.

    .. versionadded:: 0.3
    """
    user = request.raw.get("user")
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    try:
        identity = user.identity
    except NotImplementedError:
        identity = getattr(user, "display_name", None)
    return None if identity is None or identity == "" else str(identity)


def remote_user(request: HttpRequest) -> str | None:
    """``REMOTE_USER`` of the WSGI environ: the user the server or an authentication
    middleware (mod_wsgi, a reverse proxy's header turned into the variable, …)
    authenticated.

    Args:
        request: the request (``raw`` is the WSGI environ).

    Returns:
        The user name, or ``None`` when the variable is unset or empty.

    .. versionadded:: 0.3
    """
    user = request.raw.get("REMOTE_USER")
    return str(user) if user else None
