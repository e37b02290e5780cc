# SPDX-License-Identifier: MIT
"""SQLite store URLs (SQLAlchemy's conventions): ``sqlite:///relative.db``,
``sqlite:////absolute/path.db``, with query options.

``mode`` is named after SQLite's URI parameter: ``rwc`` (the default) creates a file
that does not exist, as ``sqlite3.connect`` does (right for ``open_store`` followed by
``migrate()``); ``rw`` refuses one with :class:`~onceonly.ConfigurationError` naming the
path, so a mistyped path never becomes a new, empty database.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

from onceonly.errors import ConfigurationError
from onceonly.stores.sqlite._store import SQLiteStore

__all__ = ["database_path", "from_url"]

_MODES = ("rw", "rwc")


def database_path(url: str) -> str:
    """The file a ``sqlite:`` URL names, decoded (relative to the working directory).

    Raises:
        ConfigurationError: the URL has a host or names no file.
    """
    parsed = urllib.parse.urlsplit(url)
    if parsed.netloc:
        raise ConfigurationError(
            f"SQLite URLs have no host: use sqlite:///relative.db or sqlite:////abs.db ({url!r})"
        )
    path = parsed.path[1:] if parsed.path.startswith("/") else parsed.path
    if not path:
        raise ConfigurationError(f"the SQLite URL {url!r} names no file")
    return urllib.parse.unquote(path)


def from_url(url: str, **options: Any) -> SQLiteStore:
    """Build a store from ``sqlite:///relative.db`` or ``sqlite:////absolute.db``.

    Query options: ``table``, ``outbox_table``, ``timeout`` (seconds), ``synchronous``,
    ``mode`` (``rwc``: create a missing file, the default; ``rw``: refuse it).

    Raises:
        ConfigurationError: a malformed URL, an unknown option, or ``mode=rw`` and no
            file at the path.
    """
    path = database_path(url)
    opts = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
    unknown = set(opts) - {"table", "timeout", "synchronous", "outbox_table", "mode"}
    if unknown:
        raise ConfigurationError(f"unknown SQLite URL options: {sorted(unknown)}")
    try:
        timeout = float(opts.get("timeout", 5.0))
    except ValueError:
        raise ConfigurationError(f"invalid timeout in {url!r}") from None
    mode = opts.get("mode", "rwc")
    if mode not in _MODES:
        raise ConfigurationError(f"SQLite URL mode must be rw or rwc, not {mode!r} ({url!r})")
    if mode == "rw" and not Path(path).is_file():
        raise ConfigurationError(
            f"no SQLite database at {path!r} (the URL says mode=rw: open an existing file"
            " only); check the path, or create the database with store.migrate()"
        )
    kwargs: dict[str, Any] = {
        "table": opts.get("table", "onceonly_records"),
        "timeout": timeout,
        "synchronous": opts.get("synchronous", "NORMAL"),
    }
    if "outbox_table" in opts:
        kwargs["outbox_table"] = opts["outbox_table"]
    kwargs.update(options)
    return SQLiteStore(path, url=url, **kwargs)
