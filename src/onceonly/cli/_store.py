# SPDX-License-Identifier: MIT
"""Opening stores for CLI commands: a mistyped SQLite path is an error, not a new file.

The library's ``open_store("sqlite:///x.db")`` creates the file, as ``sqlite3.connect``
does (a script that migrates expects that). An operator command that reads or operates
on existing records, or relays an existing outbox, never means to create a database: a
typo would otherwise create an empty file and then report "run store.migrate() first",
or start a relay on an empty file that never publishes anything. So every command but
``migrate`` refuses a missing SQLite file (exit 2, naming the path); ``outbox`` and
``relay`` create it with ``--create``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceonly.errors import ConfigurationError
from onceonly.types import Store

if TYPE_CHECKING:
    from onceonly.stores.postgres import PostgresStore

__all__ = ["add_create_option", "check_sqlite_exists", "open_existing", "postgres_store"]


def add_create_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--create`` (allow a SQLite URL that names a file that does not exist)."""
    parser.add_argument(
        "--create",
        action="store_true",
        help="create the SQLite database file if it does not exist (default: refuse)",
    )


def check_sqlite_exists(url: str, args: argparse.Namespace | Any) -> None:
    """Refuse a ``sqlite:`` URL whose file does not exist, unless ``args.create``.

    Raises:
        ConfigurationError: the file does not exist (the message names the path and
            how to create the database).
    """
    if not isinstance(url, str) or not url.lower().startswith("sqlite:"):
        return
    from onceonly.stores.sqlite._url import database_path

    path = database_path(url)
    if Path(path).is_file() or getattr(args, "create", False):
        return
    how = (
        "pass --create to create it"
        if hasattr(args, "create")
        else "create it with `onceonly migrate --url …`"
    )
    raise ConfigurationError(
        f"no SQLite database at {os.path.abspath(path)!r} (from {url!r}); check the path, or {how}"
    )


def open_existing(url: str, args: argparse.Namespace | Any, **options: Any) -> Store:
    """``open_store(url, **options)``, refusing a SQLite file that does not exist.

    Raises:
        ConfigurationError: see :func:`check_sqlite_exists` and ``open_store``.
    """
    from onceonly.stores import open_store

    check_sqlite_exists(url, args)
    return open_store(url, **options)


def postgres_store(store: Store) -> PostgresStore | None:
    """``store`` when it is a PostgreSQL store (partitions, ``migrate(partitioned=)``),
    else ``None`` (the PostgreSQL extra is imported only for a PostgreSQL store)."""
    if store.dialect != "postgresql":
        return None
    from onceonly.stores.postgres import PostgresStore

    return store if isinstance(store, PostgresStore) else None
