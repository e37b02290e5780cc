# SPDX-License-Identifier: MIT
"""View helpers: ``@idempotent_view`` and ``current_tx(request)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from onceonly.errors import ConfigurationError
from onceonly.http._common import idempotency
from onceonly.inbox import Tx

__all__ = ["current_tx", "idempotent_view"]

F = TypeVar("F", bound=Callable[..., Any])

TX_ATTRIBUTE = "onceonly_tx"


def idempotent_view(
    requirement: str = "required",
    *,
    wait: float = 0.0,
    atomic: bool = False,
    body_fields: tuple[str, ...] | None = None,
    ignore_fields: tuple[str, ...] = (),
) -> Callable[[F], F]:
    """Mark a view with its rule; the middleware reads it.

    Args:
        requirement: ``"required"`` (no key: 400), ``"optional"`` or ``"off"``.
        wait: seconds a duplicate waits for the request in progress before 409.
        atomic: the view's ORM writes, the claim and the stored response commit in one
            ``transaction.atomic()`` on the default database (PostgreSQL or SQLite).
        body_fields: the only JSON body fields that count in the fingerprint
            (:class:`~onceonly.http.RouteRule`).
        ignore_fields: JSON body fields that do not count in the fingerprint.

    Returns:
        A decorator returning the view itself, marked (put it below ``@csrf_exempt``
        and other wrapping decorators).

    .. versionadded:: 0.2
    """
    return idempotency(
        requirement,
        wait=wait,
        atomic=atomic,
        body_fields=body_fields,
        ignore_fields=ignore_fields,
    )


def current_tx(request: Any) -> Tx:
    """The onceonly transaction of an atomic view's request (``tx.publish`` for the outbox;
    the ORM already writes in the same transaction).

    Raises:
        ConfigurationError: the view is not an atomic view behind the middleware.

    .. versionadded:: 0.2
    """
    tx = getattr(request, TX_ATTRIBUTE, None)
    if not isinstance(tx, Tx):
        raise ConfigurationError(
            "current_tx() needs a view marked @idempotent_view(..., atomic=True) and "
            "onceonly.contrib.django.middleware.IdempotencyMiddleware in MIDDLEWARE"
        )
    return tx
