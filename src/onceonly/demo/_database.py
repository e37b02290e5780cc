# SPDX-License-Identifier: MIT
"""The database under test: URL parsing, the business tables, plain connections.

The demo's business tables (``charges`` and the naive consumer's ``processed``) live in
the same database as onceonly's records, so the onceonly handler can write its charge in
the claim's transaction. They are created, read and dropped here with the plain driver
(``sqlite3``, psycopg or PyMySQL) — never through onceonly — so the counts in the report do not
depend on the library being demonstrated.

Invariant: table names are generated here from a fixed prefix and a hexadecimal run id
and checked against ``[a-z_][a-z0-9_]*``; they are the only text ever interpolated into
SQL. Every value is a bound parameter.
"""

from __future__ import annotations

import os
import re
import sqlite3
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

__all__ = [
    "Connection",
    "DemoError",
    "Tables",
    "Target",
    "connect",
    "create_tables",
    "drop_tables",
    "parse_url",
    "read_charges",
]

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*\Z")


class DemoError(Exception):
    """The demo cannot run as asked (bad URL, missing driver, unreachable database)."""


@dataclass(frozen=True)
class Target:
    """Where the demo's database is.

    Attributes:
        url: the store URL handed to :func:`onceonly.open_store`.
        dialect: ``"sqlite"``, ``"postgresql"`` or ``"mysql"``.
        path: the SQLite file (``None`` for PostgreSQL).
        temporary: true when the demo made the database and deletes it afterwards.
    """

    url: str
    dialect: Literal["sqlite", "postgresql", "mysql"]
    path: str | None = None
    temporary: bool = False

    def describe(self) -> str:
        """A short human description (no password)."""
        if self.dialect == "sqlite":
            return "SQLite (temporary file)" if self.temporary else f"SQLite {self.path}"
        parts = urllib.parse.urlsplit(self.url)
        host = parts.hostname or "localhost"
        port = f":{parts.port}" if parts.port else ""
        name = "MariaDB/MySQL" if self.dialect == "mysql" else "PostgreSQL"
        return f"{name} {host}{port}{parts.path}"


def parse_url(url: str) -> Target:
    """Check a database URL and say where it points.

    Args:
        url: ``sqlite:///relative.db``, ``sqlite:////absolute/path.db`` or
            ``postgresql://user@host:5432/db``.

    Returns:
        The :class:`Target`.

    Raises:
        DemoError: the scheme is not supported or the URL names no database.
    """
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        if parts.netloc:
            raise DemoError(
                f"SQLite URLs have no host: use sqlite:///relative.db or "
                f"sqlite:////absolute/path.db, not {url!r}"
            )
        path = urllib.parse.unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
        if path in ("", ":memory:"):
            raise DemoError(
                f"the demo needs a SQLite file shared by its worker processes, not {url!r}:"
                " use sqlite:///relative.db or sqlite:////absolute/path.db"
            )
        return Target(url=url, dialect="sqlite", path=path)
    if scheme in ("postgresql", "postgres"):
        if not (parts.netloc or parts.path.strip("/")):
            raise DemoError(f"the PostgreSQL URL names no server or database: {url!r}")
        return Target(url=url, dialect="postgresql")
    if scheme in ("mysql", "mariadb", "mysql+pymysql", "mariadb+pymysql"):
        if not parts.path.strip("/"):
            raise DemoError(
                f"the MariaDB/MySQL URL names no database: {url!r}: use "
                "mysql://user@host:3306/db (or sqlite:///path.db)"
            )
        return Target(url=url, dialect="mysql")
    shown = scheme or "(none)"
    raise DemoError(
        f"unsupported database URL scheme {shown!r} in {url!r}: use sqlite:///path.db "
        "postgresql://user@host:5432/db or mysql://user@host:3306/db"
    )


def temporary_target(directory: str) -> Target:
    """A fresh SQLite database file inside ``directory`` (which the caller deletes)."""
    path = os.path.join(os.path.abspath(directory), "demo.db")
    return Target(url=f"sqlite:///{path}", dialect="sqlite", path=path, temporary=True)


@dataclass(frozen=True)
class Tables:
    """The business table names of one demo run."""

    naive_charges: str
    naive_processed: str
    onceonly_charges: str

    @classmethod
    def for_run(cls, run_id: str | None) -> Tables:
        """Plain names, or names suffixed with ``run_id`` so runs in a shared database
        never see each other's rows."""
        suffix = f"_{run_id}" if run_id else ""
        tables = cls(
            naive_charges=f"demo_charges_naive{suffix}",
            naive_processed=f"demo_processed_naive{suffix}",
            onceonly_charges=f"demo_charges_onceonly{suffix}",
        )
        for name in (tables.naive_charges, tables.naive_processed, tables.onceonly_charges):
            if not _IDENTIFIER.match(name):
                raise DemoError(f"invalid table name {name!r}")
        return tables

    def charges(self, side: str) -> str:
        """The charges table of ``side`` (``"naive"`` or ``"onceonly"``)."""
        return self.naive_charges if side == "naive" else self.onceonly_charges


class Connection(Protocol):
    """An autocommit connection: every statement commits on its own."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run ``sql`` (``?`` placeholders) and commit."""

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run a query (``?`` placeholders) and return its rows."""

    def close(self) -> None:
        """Close the connection."""


class _SQLiteConnection:
    def __init__(self, path: str) -> None:
        try:
            self._conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
            self._conn.execute("PRAGMA busy_timeout = 30000")
            self._conn.execute("PRAGMA journal_mode = WAL")
            # WAL + NORMAL survives a killed process (only power loss can lose a commit).
            self._conn.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.Error as exc:
            raise DemoError(f"cannot open the SQLite database {path!r}: {exc}") from exc

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._conn.execute(sql, tuple(params))

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in self._conn.execute(sql, tuple(params)).fetchall()]

    def close(self) -> None:
        self._conn.close()


class _PostgresConnection:
    def __init__(self, url: str) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise DemoError(
                "PostgreSQL needs the postgres extra: pip install 'onceonly[postgres]'"
            ) from exc
        try:
            self._conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            raise DemoError(f"cannot connect to PostgreSQL: {exc}".strip()) from exc

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._conn.execute(sql.replace("?", "%s"), tuple(params))

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return list(self._conn.execute(sql.replace("?", "%s"), tuple(params)).fetchall())

    def close(self) -> None:
        self._conn.close()


class _MySQLConnection:
    def __init__(self, url: str) -> None:
        try:
            import pymysql

            from onceonly.stores.mysql._sql import parse_url as mysql_args
        except ImportError as exc:
            raise DemoError(
                "MariaDB/MySQL needs the mysql extra: pip install 'onceonly[mysql]'"
            ) from exc
        try:
            self._conn = pymysql.connect(**mysql_args(url), autocommit=True, connect_timeout=10)
        except Exception as exc:  # PyMySQL's errors, or a bad URL (ConfigurationError)
            raise DemoError(f"cannot connect to MariaDB/MySQL: {exc}".strip()) from exc

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._conn.cursor().execute(sql.replace("?", "%s"), tuple(params))

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cur = self._conn.cursor()
        cur.execute(sql.replace("?", "%s"), tuple(params))
        return list(cur.fetchall())

    def close(self) -> None:
        self._conn.close()


def connect(target: Target) -> Connection:
    """An autocommit connection to ``target``."""
    if target.dialect == "sqlite":
        assert target.path is not None
        return _SQLiteConnection(target.path)
    if target.dialect == "mysql":
        return _MySQLConnection(target.url)
    return _PostgresConnection(target.url)


def create_tables(target: Target, tables: Tables) -> None:
    """Create the business tables, empty.

    The charges tables deliberately have no unique constraint on ``message_id``: a
    double charge must be visible as two rows, not hidden by the schema.
    """
    conn = connect(target)
    try:
        for name in (tables.naive_charges, tables.onceonly_charges):
            conn.execute(f"DROP TABLE IF EXISTS {name}")
            conn.execute(
                f"CREATE TABLE {name} (message_id TEXT NOT NULL, customer TEXT NOT NULL, "
                "amount INTEGER NOT NULL)"
            )
        conn.execute(f"DROP TABLE IF EXISTS {tables.naive_processed}")
        # MariaDB/MySQL cannot index a TEXT column without a length
        key_type = "VARCHAR(255)" if target.dialect == "mysql" else "TEXT"
        conn.execute(f"CREATE TABLE {tables.naive_processed} (message_id {key_type} PRIMARY KEY)")
    finally:
        conn.close()


def drop_tables(target: Target, tables: Tables) -> None:
    """Drop the business tables of this run."""
    conn = connect(target)
    try:
        for name in (tables.naive_charges, tables.naive_processed, tables.onceonly_charges):
            conn.execute(f"DROP TABLE IF EXISTS {name}")
    finally:
        conn.close()


def read_charges(target: Target, table: str) -> list[tuple[str, int]]:
    """Every ``(message_id, amount)`` row of a charges table."""
    conn = connect(target)
    try:
        return [
            (str(m), int(a)) for m, a in conn.fetchall(f"SELECT message_id, amount FROM {table}")
        ]
    finally:
        conn.close()
