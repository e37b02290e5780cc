# SPDX-License-Identifier: MIT
"""Errors of the outbox's own statements (the relay's and ``Outbox``'s), translated.

The stores translate the errors of their record statements; the outbox runs its
statements through ``session.execute``, whose errors are the driver's own. These
helpers turn them into the library's types: a missing table into
:class:`~onceonly.NotMigrated`, transient failures (and a write lock SQLite did not grant
in time) into :class:`~onceonly.StoreUnavailable`, the rest into
:class:`~onceonly.StoreError`.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from collections.abc import Iterator

from onceonly.errors import InFlight, NotMigrated, StoreError, StoreUnavailable

__all__ = ["driver_error", "missing_table", "store_errors", "transient"]


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a database failure worth retrying (connection lost, server
    shutting down or starting, a standby that is not yet promoted, a busy SQLite file)."""
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc)
        return any(s in text for s in ("locked", "busy", "unable to open", "disk I/O"))
    pymysql = sys.modules.get("pymysql")  # loaded if the store is MariaDB/MySQL
    if pymysql is not None and isinstance(exc, pymysql.err.Error):
        # OperationalError: lost or refused connections, deadlocks, lock wait timeouts
        return isinstance(exc, (pymysql.err.OperationalError, pymysql.err.InterfaceError))
    psycopg = sys.modules.get("psycopg")  # loaded if the store is PostgreSQL
    if psycopg is not None and isinstance(exc, psycopg.Error):
        # OperationalError: lost or refused connections, admin/crash shutdown, "starting
        # up", pool timeouts, deadlocks. ReadOnlySqlTransaction: a failover in progress.
        return isinstance(exc, (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction))
    return False


def driver_error(exc: BaseException) -> bool:
    """Whether ``exc`` comes from a database driver (sqlite3, psycopg)."""
    if isinstance(exc, sqlite3.Error):
        return True
    pymysql = sys.modules.get("pymysql")
    if pymysql is not None and isinstance(exc, pymysql.err.Error):
        return True
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(exc, psycopg.Error)


@contextlib.contextmanager
def store_errors() -> Iterator[None]:
    """Translate driver errors of the outbox's own statements (module docstring)."""
    try:
        yield
    except StoreError:
        raise
    except InFlight as exc:  # SQLite: another writer held the lock past the lock wait
        raise StoreUnavailable(f"the outbox database is busy: {exc}") from exc
    except Exception as exc:
        if missing_table(exc):
            raise NotMigrated(
                f"the outbox table is missing; run store.migrate() first ({exc})"
            ) from exc
        if transient(exc):
            raise StoreUnavailable(f"the outbox database is unavailable: {exc}") from exc
        if driver_error(exc):
            raise StoreError(f"an outbox statement failed: {exc}") from exc
        raise


def missing_table(exc: BaseException) -> bool:
    """Whether ``exc`` says a table does not exist (the store was never migrated)."""
    if isinstance(exc, sqlite3.OperationalError):
        return str(exc).startswith("no such table")
    pymysql = sys.modules.get("pymysql")
    if pymysql is not None and isinstance(exc, pymysql.err.Error):
        return bool(exc.args) and exc.args[0] == 1146  # ER_NO_SUCH_TABLE
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(exc, psycopg.errors.UndefinedTable)
