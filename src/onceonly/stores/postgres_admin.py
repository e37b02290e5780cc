# SPDX-License-Identifier: MIT
"""Operator access to a :class:`~onceonly.stores.postgres.PostgresStore` (the
:class:`~onceonly.types.AdminStore` contract).

Invariants:

* **A purge batch never waits and is never waited for long.** One autocommit statement
  ``DELETE … WHERE ctid = ANY(ARRAY(SELECT ctid … LIMIT n FOR UPDATE SKIP LOCKED))``:
  the inner select walks the expiry index, locks at most ``n`` rows and skips rows any
  other transaction holds (a claim retaking an expired key, another purger), so two
  purgers never block each other or the claim path; the outer ``WHERE`` repeats the
  rule, so a row is deleted only if it still qualifies where it is deleted.
* **The database clock.** The cutoff is read from ``clock_timestamp()`` and bound as a
  value (so the expiry index is used); time only moves on, so a row expired at that
  reading is still expired when deleted.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from psycopg import sql

from onceonly._core.admin import PurgeRule, Query, ScopeStats
from onceonly._core.admin_sql import purge_predicates, query_predicate, stats_from_rows
from onceonly._core.sql import qmark_to_format
from onceonly._core.state import Expect, Record
from onceonly.stores._postgres_sql import _RETURNING, _record
from onceonly.stores.postgres import _MIGRATE_LOCK
from onceonly.stores.postgres_session import _DriverErrors

if TYPE_CHECKING:
    from onceonly.stores.postgres import PostgresStore

__all__ = ["PostgresAdmin"]


class PostgresAdmin:
    """The admin side of a PostgreSQL store.

    .. versionadded:: 0.2
    """

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self.table = store.table
        self._t = sql.Identifier(store.table).as_string()

    def _run(self, query: str, params: list[Any]) -> list[tuple[Any, ...]]:
        with _DriverErrors(), self.store._connection(autocommit=True) as conn:
            cur = conn.execute(qmark_to_format(query).encode(), params)
            return list(cur.fetchall()) if cur.description is not None else []

    def _clock(self, older_than: float) -> tuple[datetime, datetime, float]:
        """The database's now, now minus ``older_than``, and now as epoch seconds."""
        row = self._run(
            "SELECT n.ts, n.ts - make_interval(secs => ?), date_part('epoch', n.ts)"
            " FROM (SELECT clock_timestamp() AS ts) AS n",
            [float(older_than)],
        )[0]
        return row[0], row[1], float(row[2])

    def scan(self, query: Query) -> tuple[list[Record], float]:
        now, older, epoch = self._clock(query.older_than or 0.0)
        where, params = query_predicate(query, now, older)
        rows = self._run(
            f"SELECT {_RETURNING} FROM {self._t} AS r WHERE {where} ORDER BY scope, key LIMIT ?",
            [*params, query.limit],
        )
        return [_record(r) for r in rows], epoch

    def count_purgeable(self, rule: PurgeRule) -> int:
        _, cutoff, _ = self._clock(rule.older_than)
        return sum(
            int(self._run(f"SELECT count(*) FROM {self._t} WHERE {where}", params)[0][0])
            for where, params, _ in purge_predicates(rule, cutoff)
        )

    def purge_batch(self, rule: PurgeRule, limit: int) -> int:
        _, cutoff, _ = self._clock(rule.older_than)
        t = self._t
        deleted = 0
        for where, params, order in purge_predicates(rule, cutoff):
            if deleted >= limit:
                break
            rows = self._run(
                f"DELETE FROM {t} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {t} WHERE {where}"
                f" ORDER BY {order} LIMIT ? FOR UPDATE SKIP LOCKED)) AND {where} RETURNING 1",
                [*params, limit - deleted, *params],
            )
            deleted += len(rows)
        return deleted

    def delete(self, scope: str, key: str, expect: Expect) -> bool:
        rows = self._run(
            f"DELETE FROM {self._t} AS r USING (SELECT clock_timestamp() AS ts) AS n"
            " WHERE r.scope = ? AND r.key = ? AND r.token = ? AND r.state = ?"
            " AND (NOT ? OR CASE WHEN r.state = 'completed' THEN r.expires_at <= n.ts"
            " ELSE coalesce(r.lease_until <= n.ts, true) END) RETURNING 1",
            [scope, key, expect.token, expect.state.value, expect.lapsed],
        )
        return bool(rows)

    def stats(self, scope: str | None = None) -> tuple[list[ScopeStats], float]:
        where, params = ("scope = ?", [scope]) if scope is not None else ("true", [])
        rows = self._run(
            "SELECT scope, state, count(*), date_part('epoch', min(updated_at)),"
            " count(*) FILTER (WHERE state = 'completed' AND expires_at <= n.ts),"
            " date_part('epoch', min(n.ts))"
            f" FROM {self._t}, (SELECT clock_timestamp() AS ts) AS n WHERE {where}"
            " GROUP BY scope, state",
            params,
        )
        now = float(rows[0][5]) if rows else self._clock(0.0)[2]
        return stats_from_rows([r[:5] for r in rows], now), now

    def _counters(self) -> str:
        """The counters table, created on first use (under the migrations' lock)."""
        name = sql.Identifier(f"{self.table}_counts"[:63]).as_string()
        if not getattr(self, "_counters_ready", False):
            connection = self.store._connection(autocommit=True)
            with _DriverErrors(), connection as conn, conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATE_LOCK,))
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {name} (scope text NOT NULL,"
                    " bucket bigint NOT NULL, claims bigint NOT NULL,"
                    " replays bigint NOT NULL, PRIMARY KEY (scope, bucket))"
                )
            self._counters_ready = True
        return name

    def add_counts(self, counts: Sequence[tuple[str, int, int, int]]) -> None:
        name = self._counters()
        statement = (
            f"INSERT INTO {name} AS c (scope, bucket, claims, replays) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (scope, bucket) DO UPDATE SET claims = c.claims + excluded.claims,"
            " replays = c.replays + excluded.replays"
        )
        connection = self.store._connection(autocommit=True)
        with _DriverErrors(), connection as conn, conn.transaction():
            conn.cursor().executemany(statement.encode(), list(counts))

    def read_counts(self, since: float) -> dict[str, tuple[int, int]]:
        rows = self._run(
            f"SELECT scope, sum(claims), sum(replays) FROM {self._counters()}"
            " WHERE bucket >= ? GROUP BY scope",
            [int(since)],
        )
        return {r[0]: (int(r[1]), int(r[2])) for r in rows}

    def sizes(self) -> dict[str, int]:
        row = self._run(
            "SELECT pg_table_size(to_regclass(?)), pg_indexes_size(to_regclass(?))",
            [self._t, self._t],
        )[0]
        if row[0] is None:
            return {}
        return {"table": int(row[0]), "indexes": int(row[1])}


if TYPE_CHECKING:  # the contract is checked statically
    from onceonly.types import AdminStore

    _contract: type[AdminStore] = PostgresAdmin
