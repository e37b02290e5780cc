# SPDX-License-Identifier: MIT
"""Principal callables for ``settings.ONCEONLY_HTTP["PRINCIPAL"]``.

``"onceonly.contrib.django.principals.user_principal"`` scopes keys by the logged-in
user; an anonymous visitor has no principal (``None``: a keyed request is refused with
403), never the shared text ``"None"`` that ``str(request.user.pk)`` gives every one of
them. ``rest_framework_principal`` does the same with Django REST framework's
authentication classes (token, basic, …), which run in the view, after the middleware.

.. versionadded:: 0.3
"""

from __future__ import annotations

from typing import Any

from onceonly.errors import ConfigurationError

__all__ = ["rest_framework_principal", "user_principal"]


def _principal_of(user: Any) -> str | None:
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    pk = getattr(user, "pk", None)
    return None if pk is None else str(pk)


def user_principal(request: Any) -> str | None:
    """The primary key of ``request.user``, or ``None`` for an anonymous visitor.

    Args:
        request: the Django request, after ``AuthenticationMiddleware``.

    Returns:
        ``str(request.user.pk)`` of an authenticated user, else ``None``.

    Raises:
        ConfigurationError: the request has no ``user`` (put
            ``django.contrib.auth.middleware.AuthenticationMiddleware`` before the
            idempotency middleware in ``MIDDLEWARE``).

    .. versionadded:: 0.3
    """
    if not hasattr(request, "user"):
        raise ConfigurationError(
            "request.user is not set: put django.contrib.auth.middleware."
            "AuthenticationMiddleware before onceonly's IdempotencyMiddleware in MIDDLEWARE"
        )
    return _principal_of(request.user)


def rest_framework_principal(request: Any) -> str | None:
    """The user Django REST framework's ``DEFAULT_AUTHENTICATION_CLASSES`` authenticate.

    DRF authenticates inside the view, after every middleware, so ``request.user`` is
    still anonymous for a token or basic-auth client when the key is claimed; this runs
    the same authentication classes first. Credentials they refuse give ``None`` (the
    view answers 401/403 itself, and a keyed request gets 403 ``no-principal``).

    Args:
        request: the Django request.

    Returns:
        ``str(user.pk)`` of the authenticated user, else ``None``.

    Raises:
        ImportError: Django REST framework is not installed.

    .. versionadded:: 0.3
    """
    from rest_framework.exceptions import APIException
    from rest_framework.request import Request
    from rest_framework.settings import api_settings

    authenticators = [cls() for cls in api_settings.DEFAULT_AUTHENTICATION_CLASSES]
    try:
        user = Request(request, authenticators=authenticators).user
    except APIException:
        return None
    return _principal_of(user)
