# SPDX-License-Identifier: MIT
"""The MariaDB/MySQL outbox table and its statements (``?`` placeholders; no I/O).

A relay holds its batch with ``FOR UPDATE SKIP LOCKED`` inside one transaction while it
publishes, reading through the primary key only and deleting one row a statement (a
secondary-index scan, or a multi-row delete run as one, would wait for rows another relay
holds, and two relays would deadlock). Ordered mode: an insert first locks its key's row
in ``<table>_keys`` until the transaction ends, so a key's ``seq`` order is its commit
order. DDL commits on its own here: a migration runs outside a transaction. See
:mod:`onceonly.stores._outbox_sql` for what every outbox table keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onceonly._core.sql import validate_identifier
from onceonly.stores._outbox_sql import SCHEMA_VERSION, eligible
from onceonly.types import Statement

__all__ = ["MySQLOutboxSQL"]

#: MariaDB/MySQL's clock as epoch seconds (microseconds; the store's sessions are UTC).
_NOW = "UNIX_TIMESTAMP(NOW(6))"


@dataclass(frozen=True)
class MySQLOutboxSQL:
    """The statements of one outbox table (:class:`~onceonly.types.OutboxStatements`).

    .. versionadded:: 0.5
    """

    table: str
    channel = None
    leases = False
    transactional_ddl = False

    def __post_init__(self) -> None:
        validate_identifier(self.table)

    @property
    def keys_table(self) -> str:
        """The table of per-key lock rows (ordered mode)."""
        return f"{self.table[:59]}_keys"

    def migrate(self) -> list[str]:
        t = self.table
        return [
            f"CREATE TABLE IF NOT EXISTS `{t}` ("
            " seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,"
            " id VARCHAR(64) NOT NULL UNIQUE, topic VARCHAR(255) NOT NULL,"
            " `key` VARCHAR(255), payload LONGTEXT NOT NULL, headers LONGTEXT,"
            " state VARCHAR(16) NOT NULL DEFAULT 'pending'"
            " CHECK (state IN ('pending', 'dead')), attempts INT NOT NULL DEFAULT 0,"
            " available_at DOUBLE NOT NULL, last_error LONGTEXT, created_at DOUBLE NOT NULL,"
            f" INDEX `{t[:57]}_ready` (state, available_at, seq),"
            f" INDEX `{t[:56]}_by_key` (`key`, seq)"
            ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
            # ordered mode: one row per key, locked by each insert of that key
            f"CREATE TABLE IF NOT EXISTS `{self.keys_table}` (`key` VARCHAR(255) NOT NULL"
            " PRIMARY KEY) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        ]

    def drop(self) -> list[str]:
        """The table and its table of key locks."""
        return [f"DROP TABLE IF EXISTS `{self.table}`", f"DROP TABLE IF EXISTS `{self.keys_table}`"]

    def migration(self) -> list[Statement]:
        """The DDL and the version row (each statement commits on its own)."""
        return [
            *((ddl, None) for ddl in self.migrate()),
            (
                "CREATE TABLE IF NOT EXISTS onceonly_schema"
                " (component VARCHAR(255) NOT NULL PRIMARY KEY, version INT NOT NULL)",
                None,
            ),
            (
                "INSERT INTO onceonly_schema (component, version) VALUES (?, ?)"
                " ON DUPLICATE KEY UPDATE version = GREATEST(version, VALUES(version))",
                (f"outbox:{self.table}", SCHEMA_VERSION),
            ),
        ]

    def insert(self, values: tuple[Any, ...], lock_key: str | None) -> list[Statement]:
        insert = (
            f"INSERT INTO `{self.table}` (id, topic, `key`, payload, headers, available_at,"
            f" created_at) VALUES (?, ?, ?, ?, ?, {_NOW}, {_NOW})"
        )
        if lock_key is None:
            return [(insert, values)]
        lock = (
            f"INSERT INTO `{self.keys_table}` (`key`) VALUES (?)"
            " ON DUPLICATE KEY UPDATE `key` = `key`"
        )
        return [(lock, (lock_key,)), (insert, values)]

    def claim(self, *, ordered: bool) -> str:
        """Parameters: (limit)."""
        return (
            f"SELECT o.seq, o.id, o.topic, o.key, o.payload, o.headers, o.attempts,"
            # the primary key only: a scan of a secondary index would keep locks on
            # entries of rows another relay holds, and two relays' deletes deadlock
            f" o.created_at FROM `{self.table}` o FORCE INDEX (PRIMARY) WHERE o.state = 'pending'"
            f" AND o.available_at <= {_NOW}{eligible(self.table, 'o', ordered)}"
            " ORDER BY o.seq LIMIT ? FOR UPDATE SKIP LOCKED"
        )

    def delete(self, seqs: list[int], token: int | None) -> list[Statement]:
        """One primary-key lookup per row: InnoDB may run a multi-row delete as a scan,
        which waits for rows another relay holds (and deadlocks with it)."""
        statement = f"DELETE FROM `{self.table}` WHERE seq = ?"
        return [(statement, (seq,)) for seq in seqs]

    def fail(self) -> str:
        # MySQL assigns left to right: state reads the new attempts
        return (
            f"UPDATE `{self.table}` SET attempts = attempts + 1, last_error = ?,"
            f" available_at = {_NOW} + ?,"
            " state = IF(attempts >= ?, 'dead', 'pending') WHERE seq = ?"
        )

    def postpone(self) -> str:
        return f"UPDATE `{self.table}` SET last_error = ?, available_at = {_NOW} + ? WHERE seq = ?"

    def list_rows(self) -> str:
        return (
            "SELECT seq, id, topic, `key`, payload, headers, attempts, created_at, last_error"
            f" FROM `{self.table}` WHERE state = ? ORDER BY seq LIMIT ?"
        )

    def redrive(self, *, all_dead: bool) -> str:
        where = "state = 'dead'" + ("" if all_dead else " AND id = ?")
        return (
            f"UPDATE {self.table} SET state = 'pending', attempts = 0, available_at = {_NOW}"
            f" WHERE {where}"
        )

    def counts(self) -> str:
        return f"SELECT state, count(*) FROM {self.table} GROUP BY state"
