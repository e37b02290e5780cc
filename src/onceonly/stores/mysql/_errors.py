# SPDX-License-Identifier: MIT
"""The one place PyMySQL/aiomysql errors become onceonly errors (shared by the
MariaDB/MySQL store's sync and async modules; no I/O). aiomysql raises PyMySQL's
exception classes, so one table serves both."""

from __future__ import annotations

import pymysql

from onceonly.errors import (
    InFlight,
    NotMigrated,
    OnceOnlyError,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
)

__all__ = ["_DriverErrors", "translate", "translate_driver"]

# Error numbers (MariaDB and MySQL share them).
_LOCK_WAIT_TIMEOUT = 1205
_NO_SUCH_TABLE = 1146
# The server refused the connection's configuration: access denied to the database
# (1044), access denied (1045), unknown database (1049), an authentication plugin the
# client cannot use (1251), access denied without a password (1698). No retry fixes them.
_REFUSED = frozenset({1044, 1045, 1049, 1251, 1698})


def translate_driver(
    exc: pymysql.err.Error, scope: str | None = None, key: str | None = None
) -> OnceOnlyError:
    """The onceonly error for the driver error ``exc`` (raise it ``from exc``)."""
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    if code == _LOCK_WAIT_TIMEOUT:
        return InFlight(
            "another transaction holds this key and did not finish within lock_wait",
            scope=scope,
            key=key,
        )
    if code == _NO_SUCH_TABLE:
        return NotMigrated(
            f"a table of the store is missing; run store.migrate() first ({exc})",
            scope=scope,
            key=key,
        )
    if code in _REFUSED:
        return StoreMisconfigured(
            f"MariaDB/MySQL refused the configuration: {exc}", scope=scope, key=key
        )
    if isinstance(exc, (pymysql.err.OperationalError, pymysql.err.InterfaceError)):
        # Connection lost or refused, server gone away or shutting down, deadlock,
        # too many connections: all worth a retry.
        return StoreUnavailable(f"MariaDB/MySQL is unavailable: {exc}", scope=scope, key=key)
    return StoreError(f"MariaDB/MySQL error: {exc}", scope=scope, key=key)


def translate(
    exc: BaseException, scope: str | None = None, key: str | None = None
) -> OnceOnlyError | None:
    """:func:`translate_driver`, and a socket that broke under the driver
    (:class:`StoreUnavailable`); ``None`` for anything else."""
    if isinstance(exc, pymysql.err.Error):
        return translate_driver(exc, scope, key)
    if isinstance(exc, (OSError, EOFError)):
        return StoreUnavailable(f"MariaDB/MySQL is unavailable: {exc!r}")
    return None


class _DriverErrors:
    """Translate driver errors raised by the store's own statements (:func:`translate`;
    always ``raise … from exc``)."""

    __slots__ = ("key", "scope")

    def __init__(self, scope: str | None = None, key: str | None = None) -> None:
        self.scope = scope
        self.key = key

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            return
        error = translate(exc, self.scope, self.key)
        if error is not None:
            raise error from exc
