# SPDX-License-Identifier: MIT
"""The MariaDB/MySQL store's statements, URL parsing and row conversions (no I/O),
shared by the async store and its generated sync twin.

Every statement is rendered once per table (only the validated table name is
interpolated, always backquoted; values are always bound). Times are epoch seconds in
``DOUBLE`` columns, read from the server's clock (``UNIX_TIMESTAMP(NOW(6))``: one
reading per statement; the store's connections use ``time_zone = '+00:00'`` so the
conversion never meets a daylight-saving gap). ``scope`` and ``key`` are ``VARBINARY``:
compared byte for byte (no collation folds case or pads trailing spaces), ordered as
Python orders ``str``.
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from onceonly._core.sql import validate_identifier, write_values
from onceonly._core.state import Expect, Record, State, Write
from onceonly.errors import ConfigurationError
from onceonly.stores._schema import bind_literals, drop_version_rows, version_rows
from onceonly.stores.mysql._outbox_sql import MySQLOutboxSQL

__all__ = [
    "MySQLStatements",
    "drop_statements",
    "lock_wait_seconds",
    "parse_url",
    "schema_statements",
]

SCHEMES = ("mysql", "mariadb", "mysql+pymysql", "mysql+aiomysql", "mariadb+pymysql")
NOW = "UNIX_TIMESTAMP(NOW(6))"
# The time a row is written, read after the statement waited for the row's lock (NOW(6)
# is the statement's start). A server run with --sysdate-is-now makes it NOW(6) again.
WRITTEN_AT = "UNIX_TIMESTAMP(SYSDATE(6))"
SAVEPOINT = "onceonly"
COLUMNS = (
    "scope, `key`, state, fingerprint, token, attempts, lease_until, result, error, "
    "payload, checkpoint, created_at, updated_at, completed_at, expires_at"
)
# The longest lock wait MariaDB/MySQL accept (innodb_lock_wait_timeout, whole seconds).
_MAX_LOCK_WAIT = 1073741824


def parse_url(url: str) -> dict[str, Any]:
    """The connection arguments of ``mysql://user:password@host:port/database``.

    ``mariadb://`` and ``mysql+pymysql://`` are accepted; ``?unix_socket=/path`` and
    ``?charset=`` are the query options understood.

    Raises:
        ConfigurationError: another scheme, no database, an unknown query option.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in SCHEMES:
        raise ConfigurationError(f"not a MariaDB/MySQL URL: {url!r} (mysql://user@host/db)")
    database = urllib.parse.unquote(parts.path.lstrip("/"))
    if not database:
        raise ConfigurationError(
            f"the MariaDB/MySQL URL names no database: {parts.scheme}://host:3306/DATABASE"
        )
    try:
        port = parts.port or 3306
    except ValueError as exc:
        raise ConfigurationError(f"bad port in the MariaDB/MySQL URL: {exc}") from None
    args: dict[str, Any] = {
        "host": parts.hostname or "127.0.0.1",
        "port": port,
        "user": urllib.parse.unquote(parts.username) if parts.username else "root",
        "password": urllib.parse.unquote(parts.password) if parts.password else "",
        "database": database,
        "charset": "utf8mb4",
    }
    for name, value in urllib.parse.parse_qsl(parts.query):
        if name not in ("unix_socket", "charset"):
            raise ConfigurationError(
                f"unknown option {name!r} in the MariaDB/MySQL URL (unix_socket, charset)"
            )
        args[name] = value
    _check_charset(args["charset"])
    return args


def _check_charset(name: str) -> None:
    """Refuse a character set the driver (PyMySQL's table, used by aiomysql too) lacks:
    it would fail with a bare ``AttributeError`` when connecting."""
    try:
        from pymysql.charset import charset_by_name
    except ImportError:  # pragma: no cover - the driver is checked when the store opens
        return
    if charset_by_name(name) is None:
        raise ConfigurationError(
            f"unknown charset {name!r} in the MariaDB/MySQL URL (e.g. utf8mb4)"
        )


def describe(args: dict[str, Any]) -> str:
    """Where the server is, for error messages (never the password)."""
    where = args.get("unix_socket") or f"{args['host']}:{args['port']}"
    return f"{args['user']}@{where}/{args['database']}"


def lock_wait_seconds(lock_wait: float) -> int:
    """``lock_wait`` as ``innodb_lock_wait_timeout`` (whole seconds, rounded up; 0: none)."""
    if not isinstance(lock_wait, (int, float)) or math.isnan(lock_wait) or lock_wait < 0:
        raise ConfigurationError(f"lock_wait must be a number of seconds, not {lock_wait!r}")
    if math.isinf(lock_wait):
        return _MAX_LOCK_WAIT
    return min(math.ceil(lock_wait), _MAX_LOCK_WAIT)


def bounded(statement: str, seconds: int, mariadb: bool) -> str:
    """``statement`` with its own lock-wait bound (the session's setting is untouched)."""
    if mariadb:
        return f"SET STATEMENT innodb_lock_wait_timeout={seconds} FOR {statement}"
    verb, rest = statement.split(" ", 1)  # MySQL 8: an optimizer hint after the verb
    return f"{verb} /*+ SET_VAR(innodb_lock_wait_timeout={seconds}) */ {rest}"


@dataclass(frozen=True)
class MySQLStatements:
    """The statements of one records table."""

    table: str
    claim: str
    #: MariaDB (>= 10.5): the claim returning the row it inserted or locked, and the clock
    claim_returning: str
    select: str
    select_locked: str
    get: str
    update: str
    renew: str
    #: the lease ``renew`` stored (read after it, in the same session)
    renewed: str
    checkpoint: str

    @classmethod
    def for_table(cls, table: str) -> MySQLStatements:
        t = f"`{table}`"
        row = f"SELECT {COLUMNS}, {NOW} FROM {t} WHERE scope = %s AND `key` = %s"
        # insert-or-keep: an existing row is locked and left as it is (a no-op update)
        claim = (
            f"INSERT INTO {t} ({COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, {NOW} + %s,"
            f" %s, %s, %s, %s, {NOW}, {NOW}, IF(%s, {NOW}, NULL), {NOW} + %s)"
            " ON DUPLICATE KEY UPDATE token = token"
        )
        return cls(
            table=table,
            claim=claim,
            claim_returning=f"{claim} RETURNING {COLUMNS}, {NOW}",
            select=row,
            select_locked=row + " FOR UPDATE",
            get=(
                f"SELECT {COLUMNS}, n.now FROM (SELECT {NOW} AS now) AS n"
                f" LEFT JOIN {t} ON scope = %s AND `key` = %s"
            ),
            # The version the write was decided from (spec §2): token and state, and with
            # ``lapsed`` that the lease (or expiry) has still run out on this clock.
            # (MySQL evaluates WHERE on the old row; SET reads ``checkpoint`` before
            # assigning it.)
            update=(
                f"UPDATE {t} SET checkpoint = IF(%s, checkpoint, %s), state = %s,"
                f" fingerprint = %s, token = %s, attempts = %s, lease_until = {NOW} + %s,"
                f" result = %s, error = %s, payload = %s, updated_at = {NOW},"
                f" completed_at = IF(%s, {NOW}, NULL), expires_at = {NOW} + %s"
                " WHERE scope = %s AND `key` = %s AND token = %s AND state = %s"
                " AND (NOT %s OR IF(state = 'completed', expires_at <= " + NOW + ","
                " coalesce(lease_until <= " + NOW + ", TRUE)))"
            ),
            # A holder's lease runs from when the row is written (SYSDATE: read after the
            # statement's wait for the row lock; NOW is the statement's start).
            renew=(
                f"UPDATE {t} SET lease_until = {WRITTEN_AT} + %s WHERE scope = %s"
                " AND `key` = %s AND token = %s AND state = 'in_progress'"
            ),
            renewed=(
                f"SELECT lease_until FROM {t} WHERE scope = %s AND `key` = %s AND token = %s"
                " AND state = 'in_progress'"
            ),
            checkpoint=(
                f"UPDATE {t} SET checkpoint = %s, updated_at = {WRITTEN_AT},"
                f" lease_until = coalesce({WRITTEN_AT} + %s, lease_until)"
                " WHERE scope = %s AND `key` = %s AND token = %s AND state = 'in_progress'"
            ),
        )


def records_ddl(table: str) -> str:
    t = f"`{table}`"
    return (
        f"CREATE TABLE IF NOT EXISTS {t} ("
        " scope VARBINARY(1020) NOT NULL,"
        " `key` VARBINARY(1020) NOT NULL,"
        " state VARCHAR(16) NOT NULL,"
        " fingerprint TEXT,"
        " token BIGINT NOT NULL,"
        " attempts INT NOT NULL DEFAULT 0,"
        " lease_until DOUBLE,"
        " result LONGTEXT,"
        " error LONGTEXT,"
        " payload LONGTEXT,"
        " checkpoint LONGTEXT,"
        " created_at DOUBLE NOT NULL,"
        " updated_at DOUBLE NOT NULL,"
        " completed_at DOUBLE,"
        " expires_at DOUBLE,"
        " PRIMARY KEY (scope, `key`),"
        f" CONSTRAINT `{table[:51]}_state_check`"
        " CHECK (state IN ('in_progress', 'completed', 'failed', 'dead')),"
        f" INDEX `{table[:55]}_expires` (expires_at)"
        ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
    )


SCHEMA_VERSION = 1  # of the records table
SCHEMA_DDL = (
    "CREATE TABLE IF NOT EXISTS onceonly_schema"
    " (component VARCHAR(255) NOT NULL PRIMARY KEY, version INT NOT NULL)"
    " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
)
SCHEMA_UPSERT = (
    "INSERT INTO onceonly_schema (component, version) VALUES (%s, %s)"
    " ON DUPLICATE KEY UPDATE version = GREATEST(version, VALUES(version))"
)


def schema_statements(
    table: str = "onceonly_records", outbox_table: str | None = "onceonly_outbox"
) -> list[str]:
    """The SQL of ``MySQLStore.migrate()`` as plain statements, the version rows included
    (for a migration tool).

    .. versionadded:: 0.5
    """
    ddl = [SCHEMA_DDL, records_ddl(validate_identifier(table))]
    if outbox_table is not None:
        ddl += MySQLOutboxSQL(outbox_table).migrate()
    rows = version_rows(table, outbox_table, SCHEMA_VERSION)
    return ddl + [bind_literals(SCHEMA_UPSERT, "%s", *r) for r in rows]


def drop_statements(
    table: str = "onceonly_records", outbox_table: str | None = "onceonly_outbox"
) -> list[str]:
    """Undo :func:`schema_statements` (``onceonly_schema`` stays: other tables' rows may be
    in it).

    .. versionadded:: 0.5
    """
    drops = [f"DROP TABLE IF EXISTS `{validate_identifier(table)}`"]
    if outbox_table is not None:
        drops += MySQLOutboxSQL(outbox_table).drop()
    return [*drops, drop_version_rows(version_rows(table, outbox_table, SCHEMA_VERSION))]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def record(row: Sequence[Any]) -> Record:
    """The record in ``row[:15]`` (the ``COLUMNS``)."""
    (scope, key, state, fp, token, attempts, lease, result, error, payload, checkpoint,
     created, updated, completed, expires) = row[:15]  # fmt: skip
    key = _text(key)
    return Record(
        _text(scope), key, State.parse(state, key=key), fp, int(token), int(attempts),
        _float(lease), result, error, payload, checkpoint, float(created), float(updated),
        _float(completed), _float(expires),
    )  # fmt: skip


claim_values = write_values


def update_values(scope: str, key: str, write: Write, expect: Expect) -> tuple[Any, ...]:
    """The bound values of ``update``."""
    return (
        write.keep_checkpoint,
        write.checkpoint,
        write.state.value,
        write.fingerprint,
        write.token,
        write.attempts,
        None if write.lease_seconds is None else float(write.lease_seconds),
        write.result,
        write.error,
        write.payload,
        write.completed,
        None if write.ttl_seconds is None else float(write.ttl_seconds),
        scope,
        key,
        expect.token,
        expect.state.value,
        expect.lapsed,
    )
