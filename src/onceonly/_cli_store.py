# SPDX-License-Identifier: MIT
"""Opening stores for CLI commands: a mistyped SQLite path is an error, not a new file.

The library's ``open_store("sqlite:///x.db")`` creates the file, as ``sqlite3.connect``
does (a script that migrates expects that). An operator command that reads or relays an
existing outbox almost never means to create a database: a typo would otherwise start a
relay on an empty file that never publishes anything. So commands refuse a missing
SQLite file unless ``--create`` is given.
"""

from __future__ import annotations

import argparse
import urllib.parse
from pathlib import Path
from typing import Any

from onceonly.errors import ConfigurationError

__all__ = ["add_create_option", "check_sqlite_exists"]


def add_create_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--create`` (allow a SQLite URL that names a file that does not exist)."""
    parser.add_argument(
        "--create",
        action="store_true",
        help="create the SQLite database file if it does not exist (default: refuse)",
    )


def check_sqlite_exists(url: str, args: argparse.Namespace | Any) -> None:
    """Refuse a ``sqlite:///`` URL whose file does not exist unless ``args.create``.

    Raises:
        ConfigurationError: the file does not exist.
    """
    if not isinstance(url, str) or not url.lower().startswith("sqlite:"):
        return
    path = urllib.parse.urlsplit(url).path
    path = urllib.parse.unquote(path[1:] if path.startswith("/") else path)
    if path and not Path(path).exists() and not getattr(args, "create", False):
        raise ConfigurationError(
            f"no SQLite database at {path!r} (from {url!r}); check the path, or pass "
            "--create to create it"
        )
