# SPDX-License-Identifier: MIT
"""The SQLite outbox table and its statements (``?`` placeholders; no I/O).

A relay leases its batch (``locked_until``/``lock_token``) in a short transaction and
publishes outside it: SQLite has one writer, which a batch must not hold while a broker
answers. The file's single writer serialises inserts, so a key's ``seq`` order is its
commit order without a lock of its own. See :mod:`onceonly.stores._outbox_sql` for what
every outbox table keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onceonly._core.sql import validate_identifier
from onceonly.stores._outbox_sql import COLUMNS, SCHEMA_VERSION, eligible
from onceonly.types import Statement

__all__ = ["SQLITE_NOW", "SQLiteOutboxSQL"]

#: SQLite's clock as epoch seconds (millisecond precision).
SQLITE_NOW = "((julianday('now') - 2440587.5) * 86400.0)"


@dataclass(frozen=True)
class SQLiteOutboxSQL:
    """The statements of one outbox table (:class:`~onceonly.types.OutboxStatements`).

    .. versionadded:: 0.5
    """

    table: str
    channel = None
    leases = True
    transactional_ddl = True

    def __post_init__(self) -> None:
        validate_identifier(self.table)

    def migrate(self) -> list[str]:
        t = self.table
        return [
            f"CREATE TABLE IF NOT EXISTS {t} ("
            " seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
            " topic TEXT NOT NULL, key TEXT, payload TEXT NOT NULL, headers TEXT,"
            " state TEXT NOT NULL DEFAULT 'pending', attempts INTEGER NOT NULL DEFAULT 0,"
            " available_at REAL NOT NULL, locked_until REAL, lock_token INTEGER,"
            " last_error TEXT, created_at REAL NOT NULL)",
            f"CREATE INDEX IF NOT EXISTS {t}_ready ON {t} (state, available_at, seq)",
            f"CREATE INDEX IF NOT EXISTS {t}_by_key ON {t} (key, seq) WHERE key IS NOT NULL",
        ]

    def drop(self) -> list[str]:
        return [f"DROP TABLE IF EXISTS {self.table}"]

    def migration(self) -> list[Statement]:
        """The DDL and the version row (the transaction's write lock serialises
        migrators)."""
        return [
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
        """The single writer already orders a key's inserts: ``lock_key`` needs nothing."""
        return [
            (
                f"INSERT INTO {self.table} (id, topic, key, payload, headers, available_at,"
                f" created_at) VALUES (?, ?, ?, ?, ?, {SQLITE_NOW}, {SQLITE_NOW})",
                values,
            )
        ]

    def claim(self, *, ordered: bool) -> str:
        """Parameters: (lease seconds, token, limit)."""
        t, now = self.table, SQLITE_NOW
        return (
            f"UPDATE {t} SET locked_until = {now} + ?, lock_token = ? WHERE seq IN ("
            f"SELECT o.seq FROM {t} o WHERE o.state = 'pending' AND o.available_at <= {now}"
            f" AND (o.locked_until IS NULL OR o.locked_until <= {now})"
            f"{eligible(t, 'o', ordered)} ORDER BY o.seq LIMIT ?) RETURNING {COLUMNS}"
        )

    def delete(self, seqs: list[int], token: int | None) -> list[Statement]:
        """Only rows still leased under ``token``."""
        marks = ", ".join("?" * len(seqs))
        statement = f"DELETE FROM {self.table} WHERE lock_token = ? AND seq IN ({marks})"
        return [(statement, (token, *seqs))]

    def fail(self) -> str:
        return (
            f"UPDATE {self.table} SET attempts = attempts + 1, last_error = ?,"
            f" available_at = {SQLITE_NOW} + ?, locked_until = NULL, lock_token = NULL,"
            " state = CASE WHEN attempts + 1 >= ? THEN 'dead' ELSE 'pending' END"
            " WHERE seq = ? AND lock_token = ?"
        )

    def postpone(self) -> str:
        return (
            f"UPDATE {self.table} SET last_error = ?, available_at = {SQLITE_NOW} + ?,"
            " locked_until = NULL, lock_token = NULL WHERE seq = ? AND lock_token = ?"
        )

    def list_rows(self) -> str:
        return (
            "SELECT seq, id, topic, key, payload, headers, attempts, created_at, last_error"
            f" FROM {self.table} WHERE state = ? ORDER BY seq LIMIT ?"
        )

    def redrive(self, *, all_dead: bool) -> str:
        where = "state = 'dead'" + ("" if all_dead else " AND id = ?")
        return (
            f"UPDATE {self.table} SET state = 'pending', attempts = 0,"
            f" available_at = {SQLITE_NOW} WHERE {where}"
        )

    def counts(self) -> str:
        return f"SELECT state, count(*) FROM {self.table} GROUP BY state"
