# SPDX-License-Identifier: MIT
"""The PostgreSQL stores (psycopg 3, a SQLAlchemy engine or psycopg2) and monthly partitions.

Imports psycopg, from the ``postgres`` extra.
"""

from __future__ import annotations

try:
    import psycopg  # noqa: F401
    import psycopg_pool  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a bare venv (tests/cli)
    raise ImportError(
        "the PostgreSQL store needs psycopg 3 and psycopg-pool: pip install 'onceonly[postgres]'"
    ) from exc

from onceonly.stores.postgres._partitions import DroppedPartitions, Partition, PostgresPartitions
from onceonly.stores.postgres._partitions_async import AsyncPostgresPartitions
from onceonly.stores.postgres._psycopg2_engine import Psycopg2EngineStore
from onceonly.stores.postgres._sql import drop_statements, schema_statements
from onceonly.stores.postgres._store import PostgresStore
from onceonly.stores.postgres._store_async import AsyncPostgresStore

__all__ = [
    "AsyncPostgresPartitions",
    "AsyncPostgresStore",
    "DroppedPartitions",
    "Partition",
    "PostgresPartitions",
    "PostgresStore",
    "Psycopg2EngineStore",
    "drop_statements",
    "schema_statements",
]
