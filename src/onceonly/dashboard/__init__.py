# SPDX-License-Identifier: MIT
"""The operator dashboard: records, dead letters, redrive, and the duplicate picture
(docs/operating.md, "Dashboard").

:func:`app` returns an ASGI application to mount at any sub-path of a Starlette,
FastAPI or Django (ASGI) application, or to serve with ``onceonly dashboard``. Pages
are rendered on the server and work without JavaScript (there is none); every write is
one of :class:`onceonly.AsyncAdmin`'s fenced operations, the ones ``onceonly records``
runs, or the outbox's redrive, and needs the token.

Needs the ``dashboard`` extra (Starlette and Jinja2).

.. versionadded:: 0.3
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "onceonly.dashboard needs the dashboard extra: pip install 'onceonly[dashboard]'"
    ) from exc

from onceonly.dashboard._app import Dashboard
from onceonly.dashboard._app import build as _build
from onceonly.types import AsyncStore

__all__ = ["Dashboard", "app"]


def app(
    store: AsyncStore,
    *,
    token: str | None = None,
    title: str = "onceonly",
    outbox: bool = True,
    outbox_table: str | None = None,
    page_size: int = 50,
    store_timeout: float = 5.0,
) -> Dashboard:
    """The dashboard of ``store`` as an ASGI application.

    Args:
        store: an async store (``open_async_store(url)``); on SQLite and memory the
            operator reads and writes run in a thread. The caller opens and closes it.
        token: the operator token. ``None``: the dashboard is read-only and every write
            is refused (403). With a token, writes need ``Authorization: Bearer TOKEN``
            or a session from the login form (whose forms carry a CSRF token).
        title: shown in the page header.
        outbox: show the outbox (pending and dead rows, the relay's lag, redrive).
        outbox_table: the outbox table (default: the store's).
        page_size: records per page of the records list (1..500).
        store_timeout: seconds a page or API read waits for the store before it answers
            503 (writes are never cut off). After the store was unreachable, requests
            answer 503 at once for 5 seconds instead of each waiting.

    Returns:
        The ASGI application.

    Raises:
        ConfigurationError: ``page_size`` out of range, ``store_timeout`` not positive,
            or the store offers no operator access.

    .. versionadded:: 0.3
    """
    built: Dashboard = _build(
        store, token=token, title=title, outbox=outbox, outbox_table=outbox_table,
        page_size=page_size, store_timeout=store_timeout,
    )  # fmt: skip
    return built
