# SPDX-License-Identifier: MIT
"""Operator access to a :class:`~onceonly.stores.sqlite._store.SQLiteStore` (the
:class:`~onceonly.types.AdminStore` contract).

A purge batch is one ``DELETE … WHERE (scope, key) IN (SELECT … LIMIT n)`` statement,
its own short write transaction (SQLite has one writer: the batch bound is what keeps
the claim path's wait short). The rule is re-checked by the delete's own ``WHERE``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from onceonly._core.admin import PurgeRule, Query, ScopeStats
from onceonly._core.admin_sql import purge_predicates, query_predicate, stats_from_rows
from onceonly._core.sql import validate_identifier
from onceonly._core.state import Expect, Record
from onceonly.stores.sqlite._rows import _COLUMNS, _errors, _record

if TYPE_CHECKING:
    from onceonly.stores.sqlite._store import SQLiteStore

__all__ = ["SQLiteAdmin"]


class SQLiteAdmin:
    """The admin side of a SQLite store.

    .. versionadded:: 0.2
    """

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.table = store.table

    def _run(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        with self.store.session() as s, _errors():
            return list(s.connection.execute(sql, params).fetchall())

    def scan(self, query: Query) -> tuple[list[Record], float]:
        now = self.store.clock()
        older = None if query.older_than is None else now - query.older_than
        where, params = query_predicate(query, now, older)
        rows = self._run(
            f"SELECT {_COLUMNS} FROM {self.table} WHERE {where} ORDER BY scope, key LIMIT ?",
            [*params, query.limit],
        )
        return [_record(r) for r in rows], now

    def count_purgeable(self, rule: PurgeRule) -> int:
        parts = purge_predicates(rule, self.store.clock() - rule.older_than)
        return sum(
            int(self._run(f"SELECT count(*) FROM {self.table} WHERE {where}", params)[0][0])
            for where, params, _ in parts
        )

    def purge_batch(self, rule: PurgeRule, limit: int) -> int:
        t = self.table
        deleted = 0
        for where, params, _ in purge_predicates(rule, self.store.clock() - rule.older_than):
            if deleted >= limit:
                break
            rows = self._run(
                f"DELETE FROM {t} WHERE (scope, key) IN (SELECT scope, key FROM {t}"
                f" WHERE {where} LIMIT ?) AND {where} RETURNING 1",
                [*params, limit - deleted, *params],
            )
            deleted += len(rows)
        return deleted

    def delete(self, scope: str, key: str, expect: Expect) -> bool:
        now = self.store.clock()
        rows = self._run(
            f"DELETE FROM {self.table} WHERE scope = ? AND key = ? AND token = ? AND state = ?"
            " AND (? = 0 OR CASE WHEN state = 'completed' THEN expires_at <= ?"
            " ELSE coalesce(lease_until <= ?, 1) END) RETURNING 1",
            [scope, key, expect.token, expect.state.value, expect.lapsed, now, now],
        )
        return bool(rows)

    def stats(self, scope: str | None = None) -> tuple[list[ScopeStats], float]:
        now = self.store.clock()
        where, params = ("scope = ?", [scope]) if scope is not None else ("1 = 1", [])
        rows = self._run(
            "SELECT scope, state, count(*), min(created_at),"
            " sum(CASE WHEN state = 'completed' AND expires_at <= ? THEN 1 ELSE 0 END)"
            f" FROM {self.table} WHERE {where} GROUP BY scope, state",
            [now, *params],
        )
        return stats_from_rows(rows, now), now

    def _counters(self) -> str:
        name = validate_identifier(f"{self.table}_counts"[:63])
        self._run(
            f"CREATE TABLE IF NOT EXISTS {name} (scope TEXT NOT NULL, bucket INTEGER NOT NULL,"
            " claims INTEGER NOT NULL, replays INTEGER NOT NULL, PRIMARY KEY (scope, bucket))"
            " WITHOUT ROWID",
            [],
        )
        return name

    def add_counts(self, counts: Sequence[tuple[str, int, int, int]]) -> None:
        name = self._counters()
        with self.store.transaction() as s, _errors():
            for row in counts:
                s.connection.execute(
                    f"INSERT INTO {name} (scope, bucket, claims, replays) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (scope, bucket) DO UPDATE SET claims = claims +"
                    " excluded.claims, replays = replays + excluded.replays",
                    row,
                )

    def read_counts(self, since: float) -> dict[str, tuple[int, int]]:
        name = validate_identifier(f"{self.table}_counts"[:63])
        exists = self._run("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", [name])
        if not exists:  # no counter ever flushed: nothing to read (and no DDL here)
            return {}
        rows = self._run(
            f"SELECT scope, sum(claims), sum(replays) FROM {name} WHERE bucket >= ? GROUP BY scope",
            [since],
        )
        return {r[0]: (int(r[1]), int(r[2])) for r in rows}

    def add_lateness(self, rows: Sequence[tuple[str, int, int, int, float | None]]) -> None:
        name = validate_identifier(f"{self.table}_lateness"[:63])
        self._run(  # created on first use
            f"CREATE TABLE IF NOT EXISTS {name} (scope TEXT NOT NULL, bucket INTEGER NOT NULL,"
            " bin INTEGER NOT NULL, n INTEGER NOT NULL, ttl REAL,"
            " PRIMARY KEY (scope, bucket, bin)) WITHOUT ROWID",
            [],
        )
        with self.store.transaction() as s, _errors():
            for row in rows:
                s.connection.execute(
                    f"INSERT INTO {name} (scope, bucket, bin, n, ttl) VALUES (?, ?, ?, ?, ?)"
                    " ON CONFLICT (scope, bucket, bin) DO UPDATE SET n = n + excluded.n,"
                    " ttl = coalesce(max(ttl, excluded.ttl), ttl, excluded.ttl)",
                    row,
                )

    def read_lateness(
        self, since: float, step: int
    ) -> list[tuple[str, int, int, int, float | None]]:
        name = validate_identifier(f"{self.table}_lateness"[:63])
        exists = self._run("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", [name])
        if not exists:  # nothing ever recorded: nothing to read (and no DDL here)
            return []
        rows = self._run(
            f"SELECT scope, bucket - bucket % ? AS start, bin, sum(n), max(ttl) FROM {name}"
            " WHERE bucket >= ? GROUP BY scope, start, bin ORDER BY scope, start, bin",
            [int(step), since],
        )
        return [
            (r[0], int(r[1]), int(r[2]), int(r[3]), None if r[4] is None else float(r[4]))
            for r in rows
        ]

    def sizes(self) -> dict[str, int]:
        try:
            return {"file": os.path.getsize(self.store.path)}
        except OSError:
            return {}


if TYPE_CHECKING:  # the contract is checked statically
    from onceonly.types import AdminStore

    _contract: type[AdminStore] = SQLiteAdmin
