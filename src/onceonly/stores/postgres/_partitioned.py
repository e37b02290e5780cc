# SPDX-License-Identifier: MIT
"""The time-partitioned layout of the PostgreSQL records table (opt-in): its DDL, its
claim and insert statements, and the arithmetic of partition bounds. No I/O.

* **Partitioned by ``created_at``**, by range, one partition per period (aligned to the
  Unix epoch in UTC: a day starts at 00:00 UTC), named ``{table}_pYYYYMMDDTHHMMSS`` after
  its start, plus a DEFAULT partition ``{table}_pdefault`` for rows no range covers.
  ``created_at`` is written once, by the insert: no update ever moves a row between
  partitions (a moved row would turn a concurrent fenced write into an error).
* **``(scope, key)`` stays unique across partitions.** A unique index on a partitioned
  table must include the partition key, so ``(scope, key)`` cannot be one, and an
  ``ON CONFLICT`` would let the same key in again in the next partition. Instead every
  statement that may insert a key first calls ``{table}_lookup``: a VOLATILE plpgsql
  function that takes a transaction-scoped advisory lock on the key's hash and then
  reads the key, in READ COMMITTED with a snapshot taken *after* the lock (each query of
  a volatile function sees every commit before it starts). Two inserters of one key are
  serialised by the lock, and the second sees the first's committed row. The lock is
  held to the end of the transaction, exactly as the unique index's row lock is in the
  plain layout; it waits at most ``lock_wait`` (the function sets ``lock_timeout``).
  Other isolation levels would read an older snapshot, so the function refuses them.
* **Dropping** a partition replaces deleting its rows: see ``postgres_partitions_async``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from psycopg import sql

from onceonly.errors import ConfigurationError
from onceonly.stores.postgres._sql import (
    _COLUMNS,
    _COLUMNS_DDL,
    _INSERT_VALUES,
    _NOW,
    _RECORD_ARRAY,
    _VALUE_TYPES,
    _expiry_index,
    _Statement,
    _Statements,
)
from onceonly.stores.postgres._wire import TEXT

__all__ = ["DroppedPartitions", "Partition"]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_SUFFIX = "_p20260101T000000"  # the longest suffix a partition's name gets
_DEFAULT_SUFFIX = "_pdefault"
_NAME = re.compile(r"_p(\d{8}T\d{6})$")
MIN_PERIOD = timedelta(seconds=1)


@dataclass(frozen=True)
class Partition:
    """One partition of a partitioned records table.

    Attributes:
        name: the partition's table name.
        start: the first ``created_at`` it holds (``None``: the DEFAULT partition).
        end: the first ``created_at`` it no longer holds (``None``: DEFAULT).
        rows: PostgreSQL's estimate of its rows (``pg_class.reltuples``; -1: never
            analysed).

    .. versionadded:: 0.3
    """

    name: str
    start: datetime | None
    end: datetime | None
    rows: int

    @property
    def is_default(self) -> bool:
        return self.start is None


@dataclass(frozen=True)
class DroppedPartitions:
    """What :meth:`~onceonly.stores.postgres._store.PostgresPartitions.drop_expired` did.

    Attributes:
        dropped: the partitions dropped (with ``dry_run``: that would be dropped).
        moved: records moved to the DEFAULT partition before their partition was
            dropped, because retention keeps them (in progress, failed or dead, or never
            expiring).
        waiting: partitions whose period is over but which still hold completed records
            that have not expired, with the latest expiry among them.
        busy: partitions skipped because a transaction held the table longer than
            ``lock_wait`` (the next run tries again).

    .. versionadded:: 0.3
    """

    dropped: tuple[str, ...] = ()
    moved: int = 0
    waiting: tuple[tuple[str, datetime], ...] = ()
    busy: tuple[str, ...] = ()


def check_table(table: str) -> None:
    """A partitioned table's name must leave room for its partitions' names."""
    if len(table) + len(_SUFFIX) > 63:
        raise ConfigurationError(
            f"table {table!r} is too long for the partitioned layout: at most "
            f"{63 - len(_SUFFIX)} characters (its partitions are named {table}{_SUFFIX})"
        )


def check_period(period: timedelta) -> timedelta:
    if not isinstance(period, timedelta) or period < MIN_PERIOD:
        raise ConfigurationError(f"period must be a timedelta of at least 1 second, not {period!r}")
    if period % MIN_PERIOD:
        raise ConfigurationError(f"period must be a whole number of seconds, not {period!r}")
    return period


def period_start(at: datetime, period: timedelta) -> datetime:
    """The start of the period that holds ``at`` (epoch-aligned, UTC)."""
    return _EPOCH + ((at - _EPOCH) // period) * period


def partition_name(table: str, start: datetime) -> str:
    return f"{table}_p{start.astimezone(timezone.utc):%Y%m%dT%H%M%S}"


def default_name(table: str) -> str:
    return f"{table}{_DEFAULT_SUFFIX}"


def lookup_name(table: str) -> str:
    return f"{table}_lookup"[:63]


def ranges(now: datetime, period: timedelta, ahead: int) -> list[tuple[datetime, datetime]]:
    """The ranges from the period holding ``now`` to ``ahead`` periods after it."""
    first = period_start(now, period)
    return [(first + i * period, first + (i + 1) * period) for i in range(ahead + 1)]


def records_ddl(table: str) -> list[sql.Composed]:
    """The partitioned records table, its DEFAULT partition, indexes and lookup function."""
    check_table(table)
    t = sql.Identifier(table)
    return [
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {t} (" + _COLUMNS_DDL + " PRIMARY KEY (scope, key, "
            "created_at)) PARTITION BY RANGE (created_at)"
        ).format(t=t, check=sql.Identifier(f"{table}_state_check"[:63])),
        sql.SQL("CREATE TABLE IF NOT EXISTS {} PARTITION OF {} DEFAULT").format(
            sql.Identifier(default_name(table)), t
        ),
        _expiry_index(table),
        # The records retention keeps (dropping a partition moves them): few, so small.
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS {} ON {} (state) "
            "WHERE state <> 'completed' OR expires_at IS NULL"
        ).format(sql.Identifier(f"{table}_kept"[:63]), t),
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {fn}(wait text, p_scope text, p_key text) "
            "RETURNS SETOF {t} LANGUAGE plpgsql VOLATILE AS $fn$\n"
            "DECLARE old text := current_setting('lock_timeout');\n"
            "BEGIN\n"
            "  IF current_setting('transaction_isolation') <> 'read committed' THEN\n"
            "    RAISE EXCEPTION USING ERRCODE = 'feature_not_supported', MESSAGE =\n"
            "      'a partitioned onceonly records table needs READ COMMITTED transactions';\n"
            "  END IF;\n"
            "  IF wait IS NOT NULL THEN PERFORM set_config('lock_timeout', wait, true); END IF;\n"
            "  PERFORM pg_advisory_xact_lock(hashtextextended(\n"
            "    {name} || length(p_scope) || ':' || p_scope || p_key, 0));\n"
            "  IF wait IS NOT NULL THEN PERFORM set_config('lock_timeout', old, true); END IF;\n"
            "  RETURN QUERY SELECT * FROM {t} WHERE scope = p_scope AND key = p_key;\n"
            "END\n$fn$"
        ).format(fn=sql.Identifier(lookup_name(table)), t=t, name=sql.Literal(table + ":")),
    ]


def _claim(bounded: bool) -> str:
    """Insert-or-get, shaped as the plain layout's claim (``now, record``);
    parameters: [lock_timeout], scope, key, the Write's values."""
    wait = "%s" if bounded else "NULL"
    return (
        f"WITH lk AS MATERIALIZED (SELECT * FROM {{fn}}({wait}, %s, %s)), "
        f"ins AS (INSERT INTO {{t}} AS r ({_COLUMNS}) {_INSERT_VALUES} FROM {_NOW} "
        "WHERE NOT EXISTS (SELECT 1 FROM lk) "
        "RETURNING date_part('epoch', r.updated_at) AS now) "
        "SELECT ins.now, NULL::text[] AS record FROM ins UNION ALL SELECT "
        f"date_part('epoch', clock_timestamp()), {_RECORD_ARRAY} FROM lk AS r"
    )


def _insert(bounded: bool) -> str:
    """Insert unless the key exists (no row then); parameters as :func:`_claim`'s."""
    wait = "%s" if bounded else "NULL"
    return (
        f"WITH lk AS MATERIALIZED (SELECT 1 FROM {{fn}}({wait}, %s, %s)) "
        f"INSERT INTO {{t}} AS r ({_COLUMNS}) {_INSERT_VALUES} FROM {_NOW} "
        "WHERE NOT EXISTS (SELECT 1 FROM lk) RETURNING date_part('epoch', r.updated_at)"
    )


def statements(table: str) -> _Statements:
    """The plain layout's statements with the partitioned claim and insert."""

    def render(template: str) -> bytes:
        return (
            sql.SQL(template)
            .format(t=sql.Identifier(table), fn=sql.Identifier(lookup_name(table)))
            .as_string()
            .encode()
        )

    plain = _Statements.for_table(table)
    return _Statements(
        claim=_Statement(plain=render(_claim(False)), bounded=render(_claim(True))),
        claim_types=(TEXT, TEXT, *_VALUE_TYPES),
        get=plain.get,
        insert=_Statement(plain=render(_insert(False)), bounded=render(_insert(True))),
        update=plain.update,
        renew=plain.renew,
        checkpoint=plain.checkpoint,
        partitioned=True,
    )


def partition_start(name: str) -> datetime | None:
    """The start encoded in a partition's name (``None``: not one of ours)."""
    m = _NAME.search(name)
    if m is None:
        return None
    return datetime.strptime(m.group(1), "%Y%m%dT%H%M%S").replace(tzinfo=timezone.utc)
