# SPDX-License-Identifier: MIT
"""The MySQL / MariaDB stores (PyMySQL, aiomysql, or a SQLAlchemy engine).

Imports PyMySQL, from the ``mysql`` extra.
"""

from __future__ import annotations

from onceonly.stores.mysql._engine import MySQLEngineStore
from onceonly.stores.mysql._engine_async import AsyncMySQLEngineStore
from onceonly.stores.mysql._sql import drop_statements, schema_statements
from onceonly.stores.mysql._store import MySQLStore
from onceonly.stores.mysql._store_async import AsyncMySQLStore

__all__ = [
    "AsyncMySQLEngineStore",
    "AsyncMySQLStore",
    "MySQLEngineStore",
    "MySQLStore",
    "drop_statements",
    "schema_statements",
]
