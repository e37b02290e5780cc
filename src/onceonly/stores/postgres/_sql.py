# SPDX-License-Identifier: MIT
"""The PostgreSQL store's statements and row conversions (no I/O), shared by the async
store and its generated sync twin.

Every statement is rendered once per table (only the validated table name is
interpolated; values are always bound). Times come from one ``clock_timestamp()``
reading per statement; a written row is not read back but derived from the Write and
that reading (:func:`_written`), exactly as PostgreSQL computed it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

try:
    from psycopg import sql
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the PostgreSQL store needs psycopg 3 and psycopg-pool: pip install 'onceonly[postgres]'"
    ) from exc

from onceonly._core.sql import validate_identifier, write_values
from onceonly._core.state import Expect, Record, State, Write
from onceonly.errors import ConfigurationError
from onceonly.stores._schema import bind_literals, drop_version_rows, version_rows
from onceonly.stores.postgres._outbox_sql import PostgresOutboxSQL
from onceonly.stores.postgres._wire import BOOL, FLOAT8, INT8, TEXT
from onceonly.types import Snapshot

_SAVEPOINT = "onceonly"
# The types of write_values(): scope, key, state, fingerprint, token, attempts, lease
# seconds, result, error, payload, checkpoint, completed, ttl seconds.
_VALUE_TYPES = (TEXT, TEXT, TEXT, TEXT, INT8, INT8, FLOAT8, TEXT, TEXT, TEXT, TEXT, BOOL, FLOAT8)
_MAX_LOCK_TIMEOUT_MS = 2**31 - 1

_COLUMNS = (
    "scope, key, state, fingerprint, token, attempts, lease_until, result, error, "
    "payload, checkpoint, created_at, updated_at, completed_at, expires_at"
)
# A stored record as a row: times as epoch seconds (double precision).
_RETURNING = (
    "r.scope, r.key, r.state, r.fingerprint, r.token, r.attempts, "
    "date_part('epoch', r.lease_until) AS lease_until, r.result, r.error, r.payload, "
    "r.checkpoint, date_part('epoch', r.created_at) AS created_at, "
    "date_part('epoch', r.updated_at) AS updated_at, "
    "date_part('epoch', r.completed_at) AS completed_at, "
    "date_part('epoch', r.expires_at) AS expires_at"
)
# The values of a new row from a Write; n.ts is the statement's one clock reading.
_INSERT_VALUES = (
    "SELECT %s, %s, %s, %s, %s, %s, n.ts + make_interval(secs => %s), %s, %s, %s, %s, "
    "n.ts, n.ts, CASE WHEN %s THEN n.ts END, n.ts + make_interval(secs => %s)"
)
_NOW = "(SELECT clock_timestamp() AS ts) AS n"
# A written row is returned as just its clock reading (and created_at): every other value
# is the Write's, and _written() derives the times exactly as PostgreSQL computed them.
_STAMP = "date_part('epoch', n.ts) AS now"
_NULLS = ", ".join(["NULL"] * 15)
# An existing record in one text[] column (only a claim that found its key sends it):
# the columns of _RETURNING after scope and key, times as epoch seconds in text (the
# same float8 output a float8 column has in text format). See _record_of_text().
_RECORD_ARRAY = (
    "ARRAY[r.state, r.fingerprint, r.token::text, r.attempts::text, "
    "date_part('epoch', r.lease_until)::text, r.result, r.error, r.payload, r.checkpoint, "
    "date_part('epoch', r.created_at)::text, date_part('epoch', r.updated_at)::text, "
    "date_part('epoch', r.completed_at)::text, date_part('epoch', r.expires_at)::text]"
)
# A statement that may wait for another transaction's row lock, bounded: ``cfg`` stashes
# the current lock_timeout and sets ours (the OFFSET 0 subquery is evaluated first); the
# DML reads ``cfg`` before touching a row, so the bound is in force when it waits; the
# outer SELECT restores the old value and always returns exactly one row, so the restore
# always runs. The lock_timeout is the statement's first parameter.
_CFG = (
    "cfg AS MATERIALIZED (SELECT s.old, set_config('lock_timeout', %s, true) AS new "
    "FROM (SELECT current_setting('lock_timeout') AS old OFFSET 0) AS s)"
)
_RESTORE = "set_config('lock_timeout', cfg.old, true)"


def _bounded(dml: str) -> str:
    """``dml`` (which must read ``cfg``) run under the session's lock_timeout; one row."""
    return f"WITH {_CFG}, res AS ({dml}) SELECT res.*, {_RESTORE} FROM cfg LEFT JOIN res ON true"


def _claim(bounded: bool) -> str:
    """Insert-or-get in one statement; its row is ``now, record``.

    A new key's row is just its stamp (``record`` is NULL: the record is the Write); an
    existing key's record comes as one ``text[]`` (:data:`_RECORD_ARRAY`), with the
    clock when it was read. Two columns, so the row description stays small too.
    """
    source = f"{_NOW}, cfg" if bounded else _NOW
    ins = (
        f"ins AS (INSERT INTO {{t}} AS r ({_COLUMNS}) {_INSERT_VALUES} FROM {source} "
        "ON CONFLICT (scope, key) DO NOTHING RETURNING date_part('epoch', r.updated_at) AS now)"
    )
    union = (
        f"SELECT ins.now, NULL::text[] AS record FROM ins UNION ALL SELECT "
        f"date_part('epoch', clock_timestamp()), {_RECORD_ARRAY} FROM {{t}} AS r "
        "WHERE r.scope = %s AND r.key = %s AND NOT EXISTS (SELECT 1 FROM ins)"
    )
    if bounded:  # one row even when the union is empty (a lost race): see claim()
        return (
            f"WITH {_CFG}, {ins}, res AS ({union}) "
            f"SELECT res.*, {_RESTORE} FROM cfg LEFT JOIN res ON true"
        )
    return f"WITH {ins} {union}"


def _insert(source: str) -> str:
    return (
        f"INSERT INTO {{t}} AS r ({_COLUMNS}) {_INSERT_VALUES} FROM {source} "
        "ON CONFLICT (scope, key) DO NOTHING RETURNING date_part('epoch', r.updated_at)"
    )


def _update(source: str) -> str:
    return (
        "UPDATE {t} AS r SET state = %s, fingerprint = %s, token = %s, attempts = %s, "
        "lease_until = n.ts + make_interval(secs => %s), result = %s, error = %s, "
        "payload = %s, checkpoint = CASE WHEN %s THEN r.checkpoint ELSE %s END, "
        "updated_at = n.ts, "
        "completed_at = CASE WHEN %s THEN n.ts END, "
        "expires_at = n.ts + make_interval(secs => %s) "
        f"FROM {source} WHERE r.scope = %s AND r.key = %s AND r.token = %s "
        # The version the write was decided from (spec §2): the state too, and with
        # ``lapsed`` that the lease (or expiry) has still run out on this statement's clock.
        "AND r.state = %s AND (NOT %s OR CASE WHEN r.state = 'completed' "
        "THEN r.expires_at <= n.ts ELSE coalesce(r.lease_until <= n.ts, true) END) "
        f"RETURNING {_STAMP}, date_part('epoch', r.created_at) AS created_at, r.checkpoint"
    )


# A holder's lease runs from when its write happens. Both n.ts and a clock_timestamp()
# in SET are read before the UPDATE waits for a row lock (a lock that is released with
# the row unchanged is not re-evaluated), so a renewal queued behind a long transaction
# would be born already spent. The holder's row is locked first (``lk``: its own
# parameters scope, key, token), and the lease is read from the clock after that.
def _held_row(source: str) -> str:
    guard = " AND EXISTS (SELECT 1 FROM cfg)" if "cfg" in source else ""  # bound first
    return (
        "(SELECT l.scope, l.key FROM {t} AS l WHERE l.scope = %s AND l.key = %s "
        f"AND l.token = %s AND l.state = 'in_progress'{guard} FOR UPDATE) AS lk"
    )


def _renew(source: str) -> str:
    return (
        "UPDATE {t} AS r SET lease_until = clock_timestamp() + make_interval(secs => %s) "
        f"FROM {source}, {_held_row(source)} WHERE r.scope = lk.scope AND r.key = lk.key "
        "AND r.token = %s AND r.state = 'in_progress' RETURNING date_part('epoch', r.lease_until)"
    )


def _checkpoint(source: str) -> str:
    return (
        "UPDATE {t} AS r SET checkpoint = %s, updated_at = clock_timestamp(), "
        "lease_until = coalesce(clock_timestamp() + make_interval(secs => %s), r.lease_until) "
        f"FROM {source}, {_held_row(source)} WHERE r.scope = lk.scope AND r.key = lk.key "
        "AND r.token = %s AND r.state = 'in_progress' RETURNING 1"
    )


@dataclass(frozen=True)
class _Statement:
    """One operation's SQL: ``plain``, and ``bounded`` (lock_timeout first, one row)."""

    plain: bytes
    bounded: bytes


@dataclass(frozen=True)
class _Statements:
    """The store's statements for one table, rendered once (bytes: psycopg takes them as is)."""

    claim: _Statement
    #: The types of the claim's parameters (plain layout: the Write's values, then scope
    #: and key; partitioned: scope and key first), for the claim sent on libpq directly.
    claim_types: tuple[int, ...]
    get: bytes
    insert: _Statement
    update: _Statement
    renew: _Statement
    checkpoint: _Statement
    #: The time-partitioned layout (``_postgres_partitioned``): its claim and insert take
    #: ``(scope, key, *values)`` and no ``ON CONFLICT`` arbiter exists.
    partitioned: bool = False

    @classmethod
    def for_table(cls, table: str) -> _Statements:
        render = functools.partial(_render, table)

        def both(build: Callable[[str], str]) -> _Statement:
            return _Statement(
                plain=render(build(_NOW)), bounded=render(_bounded(build(f"{_NOW}, cfg")))
            )

        return cls(
            claim=_Statement(plain=render(_claim(False)), bounded=render(_claim(True))),
            claim_types=(*_VALUE_TYPES, TEXT, TEXT),
            get=render(
                f"SELECT {_RETURNING}, date_part('epoch', n.ts) FROM {_NOW} "
                "LEFT JOIN {t} AS r ON r.scope = %s AND r.key = %s"
            ),
            insert=both(_insert),
            update=both(_update),
            renew=both(_renew),
            checkpoint=both(_checkpoint),
        )


def _render(table: str, template: str) -> bytes:
    """``template`` with ``{t}`` as the table (only the validated name is interpolated;
    values are always bound)."""
    return sql.SQL(template).format(t=sql.Identifier(table)).as_string().encode()


_BEGIN = b"BEGIN"
_OPEN_SAVEPOINT = f"SAVEPOINT {_SAVEPOINT}".encode()
_RELEASE_SAVEPOINT = f"RELEASE SAVEPOINT {_SAVEPOINT}".encode()
_BACK_TO_SAVEPOINT = f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}".encode()
_UNDO_SAVEPOINT = f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}; RELEASE SAVEPOINT {_SAVEPOINT}".encode()


def _record(row: Sequence[Any], at: int = 0) -> Record:
    """The record in ``row[at:at + 15]`` (the ``_RETURNING`` columns)."""
    (scope, key, state, fp, token, attempts, lease, result, error, payload, checkpoint,
     created, updated, completed, expires) = row[at : at + 15]  # fmt: skip
    return Record(
        scope, key, State.parse(state, key=key), fp, token, attempts, lease, result, error,
        payload, checkpoint, created, updated, completed, expires,
    )  # fmt: skip


def _time(text: str | None) -> float | None:
    return None if text is None else float(text)


def _record_of_text(scope: str, key: str, values: Sequence[str | None]) -> Record:
    """The record in a claim's ``text[]`` column (:data:`_RECORD_ARRAY`)."""
    (state, fp, token, attempts, lease, result, error, payload, checkpoint,
     created, updated, completed, expires) = values  # fmt: skip
    assert state is not None and token is not None and attempts is not None
    assert created is not None and updated is not None
    return Record(
        scope, key, State.parse(state, key=key), fp, int(token), int(attempts), _time(lease),
        result, error, payload, checkpoint, float(created), float(updated), _time(completed),
        _time(expires),
    )  # fmt: skip


def _claimed(scope: str, key: str, write: Write, row: Sequence[Any] | None) -> Snapshot | None:
    """What a claim's row says: the inserted Write or the existing record, with the
    statement's clock; ``None`` when the claim lost a race (no row, or a NULL one)."""
    if row is None or row[0] is None:
        return None
    now = row[0]
    if row[1] is None:
        return Snapshot(_written(scope, key, write, now, now), now, inserted=True)
    return Snapshot(_record_of_text(scope, key, row[1]), now)


def _written(scope: str, key: str, write: Write, now: float, created_at: float) -> Record:
    """The record PostgreSQL stored for ``write`` stamped at ``now``, without reading it.

    Times are whole microseconds: ``now + seconds`` is rounded the way ``make_interval``
    rounds, then converted back as ``date_part('epoch', …)`` does, so the result equals
    what a later read returns (``tests/stores/test_postgres_specific.py`` checks this).
    """
    now_us = round(now * 1_000_000)

    def after(seconds: float | None) -> float | None:
        return None if seconds is None else (now_us + round(seconds * 1_000_000)) / 1_000_000

    return Record(
        scope, key, write.state, write.fingerprint, write.token, write.attempts,
        after(write.lease_seconds), write.result, write.error, write.payload, write.checkpoint,
        created_at, now, now if write.completed else None, after(write.ttl_seconds),
    )  # fmt: skip


_write_values = write_values


def _update_values(scope: str, key: str, write: Write, expect: Expect) -> tuple[Any, ...]:
    """The bound values of ``update``: the SET list (``keep_checkpoint`` before the
    checkpoint), then the row and the version it must still be."""
    values = _write_values(scope, key, write)
    return (
        *values[2:10],
        write.keep_checkpoint,
        *values[10:],
        scope,
        key,
        expect.token,
        expect.state.value,
        expect.lapsed,
    )


def _updated(scope: str, key: str, write: Write, row: Sequence[Any]) -> Record:
    """The record ``update`` stored: the Write stamped at ``row[0]``, with the checkpoint
    the statement kept (``row[2]``)."""
    record = _written(scope, key, write, row[0], row[1])
    if write.keep_checkpoint and record.checkpoint != row[2]:
        return dataclasses.replace(record, checkpoint=row[2])
    return record


# The records table's columns (the plain and the partitioned layout share them).
_COLUMNS_DDL = (
    " scope text NOT NULL,"
    " key text NOT NULL,"
    " state text NOT NULL CONSTRAINT {check} CHECK"
    " (state IN ('in_progress', 'completed', 'failed', 'dead')),"
    " fingerprint text,"
    " token bigint NOT NULL,"
    " attempts integer NOT NULL DEFAULT 0,"
    " lease_until timestamptz,"
    " result text,"
    " error text,"
    " payload text,"
    " checkpoint text,"
    " created_at timestamptz NOT NULL DEFAULT clock_timestamp(),"
    " updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),"
    " completed_at timestamptz,"
    " expires_at timestamptz,"
)


def _expiry_index(table: str) -> sql.Composed:
    # Retention finds expired (completed) records: "expires_at < now" implies the
    # predicate. Partial, so a claim (in_progress, no expiry) adds no entry to it.
    return sql.SQL(
        "CREATE INDEX IF NOT EXISTS {} ON {} (expires_at) WHERE expires_at IS NOT NULL"
    ).format(sql.Identifier(f"{table}_expires"[:63]), sql.Identifier(table))


def _records_ddl(table: str) -> list[sql.Composed]:
    """The records table and its expiry index (``migrate`` runs them in its transaction)."""
    t = sql.Identifier(table)
    check = sql.Identifier(f"{table}_state_check"[:63])
    return [
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {t} (" + _COLUMNS_DDL + " PRIMARY KEY (scope, key))"
        ).format(t=t, check=check),
        _expiry_index(table),
    ]


SCHEMA_TABLE = "onceonly_schema"
# The schema version of the records table this code writes and reads.
SCHEMA_VERSION = 1


def schema_table_ddl() -> sql.Composed:
    """The table of schema versions (one row per component: ``records:<table>``, …)."""
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} (component text PRIMARY KEY, version integer NOT NULL)"
    ).format(sql.Identifier(SCHEMA_TABLE))


def version_upsert() -> sql.Composed:
    """Record a component's schema version, never lowering it. (component, version)"""
    schema = sql.Identifier(SCHEMA_TABLE)
    return sql.SQL(
        "INSERT INTO {} (component, version) VALUES (%s, %s) "
        "ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version "
        "WHERE {}.version < EXCLUDED.version"
    ).format(schema, schema)


def schema_statements(
    table: str = "onceonly_records", outbox_table: str | None = "onceonly_outbox"
) -> list[str]:
    """The SQL of ``PostgresStore.migrate()`` (the plain layout) as plain statements, the
    version rows included (for a migration tool).

    .. versionadded:: 0.5
    """
    ddl = [schema_table_ddl().as_string(None)]
    ddl += [statement.as_string(None) for statement in _records_ddl(validate_identifier(table))]
    if outbox_table is not None:
        ddl += PostgresOutboxSQL(outbox_table).migrate()
    upsert = version_upsert().as_string(None)
    rows = version_rows(table, outbox_table, SCHEMA_VERSION)
    return ddl + [bind_literals(upsert, "%s", *r) for r in rows]


def drop_statements(
    table: str = "onceonly_records", outbox_table: str | None = "onceonly_outbox"
) -> list[str]:
    """Undo :func:`schema_statements` (``onceonly_schema`` stays: other tables' rows may be
    in it).

    .. versionadded:: 0.5
    """
    drops = [f'DROP TABLE IF EXISTS "{validate_identifier(table)}"']
    if outbox_table is not None:
        drops += PostgresOutboxSQL(outbox_table).drop()
    return [*drops, drop_version_rows(version_rows(table, outbox_table, SCHEMA_VERSION))]


@functools.lru_cache(maxsize=32)
def _lock_timeout(lock_wait: float) -> str | None:
    """``lock_wait`` seconds as a ``lock_timeout`` value (``None``: wait for ever)."""
    if math.isnan(lock_wait):
        raise ConfigurationError("lock_wait must be a number of seconds")
    if math.isinf(lock_wait):
        return None
    # lock_timeout = 0 would mean "no limit": the shortest bound is one millisecond.
    return f"{min(max(1, round(lock_wait * 1000)), _MAX_LOCK_TIMEOUT_MS)}ms"
