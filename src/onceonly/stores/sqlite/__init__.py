# SPDX-License-Identifier: MIT
"""The embedded SQLite store (standard library ``sqlite3``, or a SQLAlchemy engine)."""

from __future__ import annotations

from onceonly.stores.sqlite._engine import SQLiteEngineStore
from onceonly.stores.sqlite._store import SQLiteStore, drop_statements, schema_statements

__all__ = [
    "SQLiteEngineStore",
    "SQLiteStore",
    "drop_statements",
    "schema_statements",
]
