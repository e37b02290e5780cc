# SPDX-License-Identifier: MIT
"""The outbox table and its statements, per SQL dialect (``?`` placeholders throughout).

Invariants:

* ``seq`` is the insert order; ``id`` (UUIDv7) is the message id, unique.
* Rows are ``pending`` until published (then deleted) or ``dead`` after
  ``max_attempts`` failed publishes (kept for an operator to list and redrive).
* PostgreSQL: a relay holds its batch with ``FOR UPDATE SKIP LOCKED`` inside one
  transaction while it publishes, so concurrent relays never take the same rows; a
  statement trigger NOTIFYs the relays on insert. SQLite: a relay leases its batch
  (``locked_until``/``lock_token``) in a short transaction and publishes outside it.
* Ordered mode: only the lowest pending ``seq`` of a key is eligible, so one message per
  key is in flight and a later one waits for the earlier (no global order, no cursor:
  rows that commit late are never skipped). On PostgreSQL, inserts of the same key
  take a transaction-scoped advisory lock first, so per-key ``seq`` order is commit
  order.
"""

from __future__ import annotations

from dataclasses import dataclass

from onceonly._core.sql import validate_identifier

SCHEMA_VERSION = 1
#: SQLite's clock as epoch seconds (millisecond precision); the outbox uses the store's
#: clock on both dialects, never the application's.
SQLITE_NOW = "((julianday('now') - 2440587.5) * 86400.0)"
#: MariaDB/MySQL's clock as epoch seconds (microseconds; the store's sessions are UTC).
MYSQL_NOW = "UNIX_TIMESTAMP(NOW(6))"
_COLS = "seq, id, topic, key, payload, headers, attempts, created_at"


@dataclass(frozen=True)
class OutboxSQL:
    """The statements of one outbox table in one dialect."""

    dialect: str
    table: str

    def __post_init__(self) -> None:
        validate_identifier(self.table)
        if self.dialect not in ("sqlite", "postgresql", "mysql"):
            raise ValueError(f"no outbox for the {self.dialect} store")

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel of this table (PostgreSQL)."""
        return self.table

    def migrate(self) -> list[str]:
        t = self.table
        if self.dialect == "mysql":
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
        if self.dialect == "sqlite":
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
        """Undo :meth:`migrate` (the tables, and PostgreSQL's notify function)."""
        t = self.table
        if self.dialect == "mysql":
            return [f"DROP TABLE IF EXISTS `{t}`", f"DROP TABLE IF EXISTS `{self.keys_table}`"]
        if self.dialect == "sqlite":
            return [f"DROP TABLE IF EXISTS {t}"]
        return [f"DROP TABLE IF EXISTS {t}", f"DROP FUNCTION IF EXISTS {t}_notify()"]

    @property
    def keys_table(self) -> str:
        """MariaDB/MySQL: the table of per-key lock rows (ordered mode)."""
        return f"{self.table[:59]}_keys"

    def lock_key(self) -> str:
        """MariaDB/MySQL, ordered mode: lock the key's row until the transaction ends, so
        a key's inserts are serialised and ``seq`` order is commit order. (key)"""
        return (
            f"INSERT INTO `{self.keys_table}` (`key`) VALUES (?)"
            " ON DUPLICATE KEY UPDATE `key` = `key`"
        )

    def insert(self, *, lock_key: bool) -> str:
        """Parameters: id, topic, key, payload, headers (preceded by the key to lock)."""
        t = self.table
        if self.dialect == "sqlite":
            return (
                f"INSERT INTO {t} (id, topic, key, payload, headers, available_at, created_at)"
                f" VALUES (?, ?, ?, ?, ?, {SQLITE_NOW}, {SQLITE_NOW})"
            )
        if self.dialect == "mysql":
            return (
                f"INSERT INTO `{t}` (id, topic, `key`, payload, headers, available_at,"
                f" created_at) VALUES (?, ?, ?, ?, ?, {MYSQL_NOW}, {MYSQL_NOW})"
            )
        values = "INSERT INTO {t} (id, topic, key, payload, headers) "
        if lock_key:
            return (
                "WITH lock AS (SELECT pg_advisory_xact_lock(hashtextextended(?, 0)))"
                f" {values.format(t=t)}SELECT ?, ?, ?, ?, ? FROM lock"
            )
        return f"{values.format(t=t)}VALUES (?, ?, ?, ?, ?)"

    def _eligible(self, alias: str, ordered: bool) -> str:
        if not ordered:
            return ""
        return (
            f" AND ({alias}.key IS NULL OR NOT EXISTS (SELECT 1 FROM {self.table} p"
            f" WHERE p.key = {alias}.key AND p.seq < {alias}.seq AND p.state = 'pending'))"
        )

    def claim(self, *, ordered: bool) -> str:
        """PostgreSQL: (limit). SQLite: (lease seconds, token, limit)."""
        t = self.table
        if self.dialect == "postgresql":
            return (
                f"SELECT seq, id, topic, key, payload, headers, attempts,"
                f" extract(epoch FROM created_at)::float8 FROM {t} o"
                " WHERE o.state = 'pending' AND o.available_at <= clock_timestamp()"
                f"{self._eligible('o', ordered)} ORDER BY o.seq LIMIT ? FOR UPDATE SKIP LOCKED"
            )
        if self.dialect == "mysql":
            return (
                f"SELECT o.seq, o.id, o.topic, o.key, o.payload, o.headers, o.attempts,"
                # the primary key only: a scan of a secondary index would keep locks on
                # entries of rows another relay holds, and two relays' deletes deadlock
                f" o.created_at FROM `{t}` o FORCE INDEX (PRIMARY) WHERE o.state = 'pending'"
                f" AND o.available_at <= {MYSQL_NOW}{self._eligible('o', ordered)}"
                " ORDER BY o.seq LIMIT ? FOR UPDATE SKIP LOCKED"
            )
        now = SQLITE_NOW
        return (
            f"UPDATE {t} SET locked_until = {now} + ?, lock_token = ? WHERE seq IN ("
            f"SELECT o.seq FROM {t} o WHERE o.state = 'pending' AND o.available_at <= {now}"
            f" AND (o.locked_until IS NULL OR o.locked_until <= {now})"
            f"{self._eligible('o', ordered)} ORDER BY o.seq LIMIT ?) RETURNING {_COLS}"
        )

    def delete(self, n: int) -> str:
        """Delete published rows. PostgreSQL: (seqs array). SQLite: (token, *seqs)."""
        if self.dialect == "postgresql":
            return f"DELETE FROM {self.table} WHERE seq = ANY(?)"
        marks = ", ".join("?" * n)
        if self.dialect == "mysql":  # (seq): one row a statement (see the relay)
            return f"DELETE FROM `{self.table}` WHERE seq = ?"
        return f"DELETE FROM {self.table} WHERE lock_token = ? AND seq IN ({marks})"

    def fail(self) -> str:
        """A failed publish: (error, delay seconds, max_attempts, seq[, token])."""
        t = self.table
        if self.dialect == "mysql":  # MySQL assigns left to right: state reads the new attempts
            return (
                f"UPDATE `{t}` SET attempts = attempts + 1, last_error = ?,"
                f" available_at = {MYSQL_NOW} + ?,"
                " state = IF(attempts >= ?, 'dead', 'pending') WHERE seq = ?"
            )
        if self.dialect == "postgresql":
            return (
                f"UPDATE {t} SET attempts = attempts + 1, last_error = ?,"
                " available_at = clock_timestamp() + make_interval(secs => ?),"
                " state = CASE WHEN attempts + 1 >= ? THEN 'dead' ELSE 'pending' END"
                " WHERE seq = ?"
            )
        return (
            f"UPDATE {t} SET attempts = attempts + 1, last_error = ?,"
            f" available_at = {SQLITE_NOW} + ?, locked_until = NULL, lock_token = NULL,"
            " state = CASE WHEN attempts + 1 >= ? THEN 'dead' ELSE 'pending' END"
            " WHERE seq = ? AND lock_token = ?"
        )

    def postpone(self) -> str:
        """A publish that failed because the broker was unreachable: no attempt counted,
        the row waits ``delay`` seconds. (error, delay seconds, seq[, token])."""
        t = self.table
        if self.dialect == "mysql":
            return f"UPDATE `{t}` SET last_error = ?, available_at = {MYSQL_NOW} + ? WHERE seq = ?"
        if self.dialect == "postgresql":
            return (
                f"UPDATE {t} SET last_error = ?,"
                " available_at = clock_timestamp() + make_interval(secs => ?) WHERE seq = ?"
            )
        return (
            f"UPDATE {t} SET last_error = ?, available_at = {SQLITE_NOW} + ?,"
            " locked_until = NULL, lock_token = NULL WHERE seq = ? AND lock_token = ?"
        )

    def list_rows(self) -> str:
        """Rows in a state: (state, limit)."""
        created = (
            "extract(epoch FROM created_at)::float8"
            if self.dialect == "postgresql"
            else "created_at"
        )
        key, table = (
            ("`key`", f"`{self.table}`") if self.dialect == "mysql" else ("key", self.table)
        )
        return (
            f"SELECT seq, id, topic, {key}, payload, headers, attempts, {created}, last_error"
            f" FROM {table} WHERE state = ? ORDER BY seq LIMIT ?"
        )

    def redrive(self, *, all_dead: bool) -> str:
        """Dead rows back to pending with zero attempts: (id) or nothing for all."""
        now = {"postgresql": "clock_timestamp()", "mysql": MYSQL_NOW}.get(self.dialect, SQLITE_NOW)
        where = "state = 'dead'" + ("" if all_dead else " AND id = ?")
        return (
            f"UPDATE {self.table} SET state = 'pending', attempts = 0, available_at = {now}"
            f" WHERE {where}"
        )

    def counts(self) -> str:
        return f"SELECT state, count(*) FROM {self.table} GROUP BY state"
