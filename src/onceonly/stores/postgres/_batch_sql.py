# SPDX-License-Identifier: MIT
"""The PostgreSQL store's set-based statements for a batch (docs/spec.md §1.6a; no I/O).

* ``claim_many``: the claims of every key of a batch in one statement. Rows are
  written (new keys) or row-locked (existing keys: ``ON CONFLICT DO UPDATE … WHERE
  false`` locks the conflicting row without changing it) **in key order** (code-point
  order, ``COLLATE "C"``: Python's order, which the per-key path follows, whatever the
  database's collation), so two
  batches sharing keys lock them in the same order, like one key at a time would, and
  do not deadlock; after it, every key of the batch is this transaction's to write
  (no later statement of the batch waits for a row lock). Each key's row is
  ``key, now, record``: ``record`` NULL for a key it inserted (the record is the Write),
  else the existing record as one ``text[]`` (the single claim's shape,
  :data:`~onceonly.stores.postgres._sql._RECORD_ARRAY`), read in the statement's
  snapshot: a row committed by a transaction the statement waited for is not in it
  (the key comes back without a record and is read again).
* ``update_many``: conditional writes of several keys in one statement, each checked
  against the version it was decided from exactly as the single ``update`` checks it.

Values are bound as arrays (one per column), the table name is the only interpolation.
Only the plain layout: the time-partitioned one has no ``ON CONFLICT`` arbiter and
claims key by key in the order given, its claim taking a transaction-scoped advisory lock
on every key, existing or new (``_partitioned``), so the order holds there too.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from onceonly._core.state import Expect, Write
from onceonly.stores.postgres._sql import (
    _CFG,
    _COLUMNS,
    _RECORD_ARRAY,
    _RESTORE,
    _bounded,
    _render,
    _Statement,
)

__all__ = ["BatchStatements", "claim_arrays", "update_arrays"]

# The Write's columns as arrays, in write_values() order after scope.
_ARRAYS = (
    "unnest(%s::text[], %s::text[], %s::text[], %s::int8[], %s::int8[], %s::float8[], "
    "%s::text[], %s::text[], %s::text[], %s::text[], %s::bool[], %s::float8[]) WITH ORDINALITY "
    "AS i(key, state, fingerprint, token, attempts, lease, result, error, payload, "
    "checkpoint, completed, ttl, ord)"
)


def _claim_many(bounded: bool) -> str:
    source = (
        "(SELECT clock_timestamp() AS ts) AS n, cfg"
        if bounded
        else ("(SELECT clock_timestamp() AS ts) AS n")
    )
    ins = (
        f"ins AS (INSERT INTO {{t}} AS r ({_COLUMNS}) SELECT %s, i.key, i.state, "
        "i.fingerprint, i.token, i.attempts, n.ts + make_interval(secs => i.lease), i.result, "
        "i.error, i.payload, i.checkpoint, n.ts, n.ts, CASE WHEN i.completed THEN n.ts END, "
        f'n.ts + make_interval(secs => i.ttl) FROM i, {source} ORDER BY i.key COLLATE "C" '
        # lock the existing rows too, in the same (key) order: WHERE false changes nothing
        "ON CONFLICT (scope, key) DO UPDATE SET state = r.state WHERE false "
        "RETURNING r.key, date_part('epoch', r.updated_at) AS now)"
    )
    rows = (
        "SELECT i.key, coalesce(ins.now, date_part('epoch', clock_timestamp())) AS now, "
        f"CASE WHEN ins.key IS NULL AND r.key IS NOT NULL THEN {_RECORD_ARRAY} END AS record, "
        "ins.key IS NOT NULL AS inserted "
        "FROM i LEFT JOIN ins ON ins.key = i.key LEFT JOIN "
        # the batch's rows found by key (an index scan), not the whole scope hashed
        "(SELECT * FROM {t} WHERE scope = %s AND key = ANY(ARRAY(SELECT key FROM i))) AS r "
        "ON ins.key IS NULL AND r.key = i.key"
    )
    if bounded:
        return (
            f"WITH {_CFG}, i AS MATERIALIZED (SELECT * FROM {_ARRAYS}), {ins}, res AS ({rows}) "
            f"SELECT res.*, {_RESTORE} FROM cfg LEFT JOIN res ON true"
        )
    return f"WITH i AS MATERIALIZED (SELECT * FROM {_ARRAYS}), {ins} {rows}"


def _update_many(source: str) -> str:
    return (
        "UPDATE {t} AS r SET state = u.state, fingerprint = u.fingerprint, token = u.token, "
        "attempts = u.attempts, lease_until = n.ts + make_interval(secs => u.lease), "
        "result = u.result, error = u.error, payload = u.payload, "
        "checkpoint = CASE WHEN u.keep THEN r.checkpoint ELSE u.checkpoint END, "
        "updated_at = n.ts, completed_at = CASE WHEN u.completed THEN n.ts END, "
        "expires_at = n.ts + make_interval(secs => u.ttl) "
        f"FROM {source}, unnest(%s::text[], %s::text[], %s::text[], %s::int8[], %s::int8[], "
        "%s::float8[], %s::text[], %s::text[], %s::text[], %s::bool[], %s::text[], %s::bool[], "
        "%s::float8[], %s::int8[], %s::text[], %s::bool[]) AS u(key, state, fingerprint, token, "
        "attempts, lease, result, error, payload, keep, checkpoint, completed, ttl, "
        "x_token, x_state, lapsed) "
        "WHERE r.scope = %s AND r.key = ANY(%s::text[]) AND r.key = u.key "
        "AND r.token = u.x_token AND r.state = u.x_state "
        "AND (NOT u.lapsed OR CASE WHEN r.state = 'completed' "
        "THEN r.expires_at <= n.ts ELSE coalesce(r.lease_until <= n.ts, true) END) "
        "RETURNING r.key, date_part('epoch', n.ts) AS now, "
        "date_part('epoch', r.created_at) AS created_at, r.checkpoint"
    )


@dataclass(frozen=True)
class BatchStatements:
    """The set-based statements for one table, rendered once."""

    claim_many: _Statement
    update_many: _Statement

    @classmethod
    @functools.lru_cache(maxsize=64)
    def for_table(cls, table: str) -> BatchStatements:
        render = functools.partial(_render, table)
        now = "(SELECT clock_timestamp() AS ts) AS n"
        return cls(
            claim_many=_Statement(
                plain=render(_claim_many(False)), bounded=render(_claim_many(True))
            ),
            update_many=_Statement(
                plain=render(_update_many(now)),
                bounded=render(_bounded(_update_many(f"{now}, cfg"))),
            ),
        )


def _columns(writes: Sequence[Write]) -> list[list[Any]]:
    """The Writes' values as one list per column (write_values() order after the key)."""
    return [
        [w.state.value for w in writes],
        [w.fingerprint for w in writes],
        [w.token for w in writes],
        [w.attempts for w in writes],
        [None if w.lease_seconds is None else float(w.lease_seconds) for w in writes],
        [w.result for w in writes],
        [w.error for w in writes],
        [w.payload for w in writes],
        [w.checkpoint for w in writes],
        [w.completed for w in writes],
        [None if w.ttl_seconds is None else float(w.ttl_seconds) for w in writes],
    ]


def claim_arrays(scope: str, claims: Sequence[tuple[str, Write]]) -> tuple[Any, ...]:
    """The parameters of ``claim_many`` (without the lock timeout)."""
    keys = [k for k, _ in claims]
    return (keys, *_columns([w for _, w in claims]), scope, scope)


def update_arrays(scope: str, writes: Sequence[tuple[str, Expect, Write]]) -> tuple[Any, ...]:
    """The parameters of ``update_many`` (without the lock timeout)."""
    ws = [w for _, _, w in writes]
    cols = _columns(ws)
    keys = [k for k, _, _ in writes]
    return (
        keys,
        *cols[:8],
        [w.keep_checkpoint for w in ws],
        *cols[8:],
        [x.token for _, x, _ in writes],
        [x.state.value for _, x, _ in writes],
        [x.lapsed for _, x, _ in writes],
        scope,
        keys,
    )
