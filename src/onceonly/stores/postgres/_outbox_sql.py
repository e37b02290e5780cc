# SPDX-License-Identifier: MIT
"""The PostgreSQL outbox table and its statements (``?`` placeholders; no I/O).

A relay holds its batch with ``FOR UPDATE SKIP LOCKED`` inside one transaction while it
publishes, so concurrent relays never take the same rows; a statement trigger NOTIFYs
the table's channel on insert (the relays LISTEN). Ordered mode: inserts of one key take
a transaction-scoped advisory lock first, so a key's ``seq`` order is its commit order.
See :mod:`onceonly.stores._outbox_sql` for what every outbox table keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onceonly._core.sql import validate_identifier
from onceonly.stores._outbox_sql import SCHEMA_VERSION, eligible
from onceonly.types import Statement

__all__ = ["PostgresOutboxSQL"]

_NOW = "clock_timestamp()"


@dataclass(frozen=True)
class PostgresOutboxSQL:
    """The statements of one outbox table (:class:`~onceonly.types.OutboxStatements`).

    .. versionadded:: 0.5
    """

    table: str
    leases = False
    transactional_ddl = True

    def __post_init__(self) -> None:
        validate_identifier(self.table)

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel of this table: its name."""
        return self.table

    def migrate(self) -> list[str]:
        t = self.table
        return [
            f"CREATE TABLE IF NOT EXISTS {t} ("
            " seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id text NOT NULL UNIQUE,"
            " topic text NOT NULL, key text, payload text NOT NULL, headers text,"
            " state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'dead')),"
            " attempts integer NOT NULL DEFAULT 0,"
            " available_at timestamptz NOT NULL DEFAULT clock_timestamp(),"
            " last_error text, created_at timestamptz NOT NULL DEFAULT clock_timestamp())",
            f"CREATE INDEX IF NOT EXISTS {t}_ready ON {t} (state, available_at, seq)",
            f"CREATE INDEX IF NOT EXISTS {t}_by_key ON {t} (key, seq) WHERE key IS NOT NULL",
            f"CREATE OR REPLACE FUNCTION {t}_notify() RETURNS trigger LANGUAGE plpgsql AS"
            f" $$ BEGIN PERFORM pg_notify('{t}', ''); RETURN NULL; END $$",
            f"DROP TRIGGER IF EXISTS {t}_notify ON {t}",
            f"CREATE TRIGGER {t}_notify AFTER INSERT ON {t}"
            f" FOR EACH STATEMENT EXECUTE FUNCTION {t}_notify()",
        ]

    def drop(self) -> list[str]:
        """The table and its notify function."""
        t = self.table
        return [f"DROP TABLE IF EXISTS {t}", f"DROP FUNCTION IF EXISTS {t}_notify()"]

    def migration(self) -> list[Statement]:
        """One migrator at a time (an advisory lock for the transaction), the DDL, the
        version row."""
        return [
            ("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", (f"onceonly:{self.table}",)),
            *((ddl, None) for ddl in self.migrate()),
            (
                "CREATE TABLE IF NOT EXISTS onceonly_schema"
                " (component TEXT PRIMARY KEY, version INTEGER NOT NULL)",
                None,
            ),
            (
                "INSERT INTO onceonly_schema (component, version) VALUES (?, ?)"
                " ON CONFLICT (component) DO UPDATE SET version = excluded.version"
                " WHERE excluded.version > onceonly_schema.version",
                (f"outbox:{self.table}", SCHEMA_VERSION),
            ),
        ]

    def insert(self, values: tuple[Any, ...], lock_key: str | None) -> list[Statement]:
        columns = f"INSERT INTO {self.table} (id, topic, key, payload, headers) "
        if lock_key is None:
            return [(f"{columns}VALUES (?, ?, ?, ?, ?)", values)]
        return [
            (
                "WITH lock AS (SELECT pg_advisory_xact_lock(hashtextextended(?, 0)))"
                f" {columns}SELECT ?, ?, ?, ?, ? FROM lock",
                (lock_key, *values),
            )
        ]

    def claim(self, *, ordered: bool) -> str:
        """Parameters: (limit)."""
        return (
            f"SELECT seq, id, topic, key, payload, headers, attempts,"
            f" extract(epoch FROM created_at)::float8 FROM {self.table} o"
            f" WHERE o.state = 'pending' AND o.available_at <= {_NOW}"
            f"{eligible(self.table, 'o', ordered)} ORDER BY o.seq LIMIT ? FOR UPDATE SKIP LOCKED"
        )

    def delete(self, seqs: list[int], token: int | None) -> list[Statement]:
        return [(f"DELETE FROM {self.table} WHERE seq = ANY(?)", (seqs,))]

    def fail(self) -> str:
        return (
            f"UPDATE {self.table} SET attempts = attempts + 1, last_error = ?,"
            f" available_at = {_NOW} + make_interval(secs => ?),"
            " state = CASE WHEN attempts + 1 >= ? THEN 'dead' ELSE 'pending' END"
            " WHERE seq = ?"
        )

    def postpone(self) -> str:
        return (
            f"UPDATE {self.table} SET last_error = ?,"
            f" available_at = {_NOW} + make_interval(secs => ?) WHERE seq = ?"
        )

    def list_rows(self) -> str:
        return (
            "SELECT seq, id, topic, key, payload, headers, attempts,"
            " extract(epoch FROM created_at)::float8, last_error"
            f" FROM {self.table} WHERE state = ? ORDER BY seq LIMIT ?"
        )

    def redrive(self, *, all_dead: bool) -> str:
        where = "state = 'dead'" + ("" if all_dead else " AND id = ?")
        return (
            f"UPDATE {self.table} SET state = 'pending', attempts = 0, available_at = {_NOW}"
            f" WHERE {where}"
        )

    def counts(self) -> str:
        return f"SELECT state, count(*) FROM {self.table} GROUP BY state"
