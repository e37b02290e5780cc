# SPDX-License-Identifier: MIT
"""SQLite store URLs (SQLAlchemy's conventions): ``sqlite:///relative.db``,
``sqlite:////absolute/path.db``, with query options."""

from __future__ import annotations

import urllib.parse
from typing import Any

from onceonly.errors import ConfigurationError
from onceonly.stores.sqlite import SQLiteStore

__all__ = ["from_url"]


def from_url(url: str, **options: Any) -> SQLiteStore:
    """Build a store from ``sqlite:///relative.db`` or ``sqlite:////absolute.db``.

    Query options: ``table``, ``timeout`` (seconds), ``synchronous``.
    """
    parsed = urllib.parse.urlsplit(url)
    if parsed.netloc:
        raise ConfigurationError(
            f"SQLite URLs have no host: use sqlite:///relative.db or sqlite:////abs.db ({url!r})"
        )
    path = parsed.path[1:] if parsed.path.startswith("/") else parsed.path
    if not path:
        raise ConfigurationError(f"the SQLite URL {url!r} names no file")
    opts = dict(urllib.parse.parse_qsl(parsed.query))
    unknown = set(opts) - {"table", "timeout", "synchronous", "outbox_table"}
    if unknown:
        raise ConfigurationError(f"unknown SQLite URL options: {sorted(unknown)}")
    try:
        timeout = float(opts.get("timeout", 5.0))
    except ValueError:
        raise ConfigurationError(f"invalid timeout in {url!r}") from None
    kwargs: dict[str, Any] = {
        "table": opts.get("table", "onceonly_records"),
        "timeout": timeout,
        "synchronous": opts.get("synchronous", "NORMAL"),
    }
    if "outbox_table" in opts:
        kwargs["outbox_table"] = opts["outbox_table"]
    kwargs.update(options)
    return SQLiteStore(urllib.parse.unquote(path), url=url, **kwargs)
