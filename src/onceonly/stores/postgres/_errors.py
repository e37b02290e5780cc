# SPDX-License-Identifier: MIT
"""The one place PostgreSQL driver and pool errors become onceonly errors (shared by
the PostgreSQL store's sync and async modules; no I/O): :func:`translate` for psycopg 3,
:func:`translate_psycopg2` for a psycopg2 connection the store runs on."""

from __future__ import annotations

import importlib
import sys

import psycopg
from psycopg_pool import PoolClosed

from onceonly.errors import (
    ConfigurationError,
    InFlight,
    NotMigrated,
    OnceOnlyError,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
)

__all__ = [
    "_DriverErrors",
    "translate",
    "translate_psycopg2",
    "translate_statement",
    "unavailable",
]

# SQLSTATEs of a connection the server refused for its configuration: invalid_catalog_name
# (no such database) and the invalid_authorization_specification class (28000, 28P01).
_REFUSED_STATES = ("3D000", "28000", "28P01")
# libpq reports a refused connection without a SQLSTATE (psycopg's ``sqlstate`` is None
# then): what the server (English messages) and libpq say in those cases.
_REFUSED_TEXT = (
    "does not exist",  # database "x" does not exist / role "x" does not exist
    "authentication failed",  # password, peer, ident, scram, ldap ... authentication
    "no pg_hba.conf entry",
    "pg_hba.conf rejects connection",
    "no password supplied",
    "is not permitted to log in",
    "permission denied for database",
    "does not have connect privilege",
)


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` is the server refusing the connection's configuration (no such
    database, login refused), which no retry fixes; not an outage."""
    state = getattr(exc, "sqlstate", None)
    if state in _REFUSED_STATES:
        return True
    text = str(exc).lower()
    return (
        isinstance(exc, psycopg.OperationalError)
        and state is None
        and ("fatal:" in text or "fe_sendauth" in text)
        and any(needle in text for needle in _REFUSED_TEXT)
    )


def unavailable(
    message: str, exc: BaseException, scope: str | None = None, key: str | None = None
) -> StoreUnavailable:
    """The error for a failed connection: :class:`StoreMisconfigured` when the server
    refused the database or the login (exit 2 on the command line), otherwise the
    transient :class:`StoreUnavailable`."""
    if refused(exc):
        return StoreMisconfigured(message, scope=scope, key=key)
    return StoreUnavailable(message, scope=scope, key=key)


def translate(
    exc: psycopg.Error,
    scope: str | None = None,
    key: str | None = None,
    *,
    waiting: bool = False,
    read_only_transient: bool = False,
) -> OnceOnlyError:
    """The onceonly error for the psycopg (or pool) error ``exc`` (raise it ``from exc``).

    ``waiting``: the statement may have been waiting for another transaction's lock, so
    a cancellation means that wait ran out (:class:`InFlight`). ``read_only_transient``:
    the transaction is the store's own, so a refused write in a read-only transaction
    means the server is a standby (a failover in progress: :class:`StoreUnavailable`);
    otherwise it may be the caller's ``READ ONLY`` transaction (:class:`StoreError`).
    """
    if isinstance(exc, psycopg.errors.LockNotAvailable) or (
        waiting and isinstance(exc, psycopg.errors.QueryCanceled)
    ):
        return InFlight(
            "another transaction holds this key and did not finish within lock_wait",
            scope=scope,
            key=key,
        )
    if isinstance(exc, PoolClosed):
        return StoreError("the store is closed", scope=scope, key=key)
    if isinstance(exc, psycopg.errors.UndefinedTable):
        return NotMigrated(
            "a table of the store is missing; run store.migrate() first "
            f"({exc.diag.message_primary or exc})",
            scope=scope,
            key=key,
        )
    if isinstance(exc, psycopg.errors.FeatureNotSupported) and "onceonly" in str(exc):
        return ConfigurationError(exc.diag.message_primary or str(exc), scope=scope, key=key)
    if isinstance(exc, psycopg.OperationalError):
        # Connection lost or refused, pool timeout, admin shutdown, statement
        # timeout, serialization failure, deadlock: all worth a retry. A database
        # that does not exist or a login refused is not: StoreMisconfigured.
        return unavailable(f"PostgreSQL is unavailable: {exc}", exc, scope, key)
    if read_only_transient and isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return StoreUnavailable(
            f"PostgreSQL is read-only (a failover?): {exc}", scope=scope, key=key
        )
    return StoreError(f"PostgreSQL error: {exc}", scope=scope, key=key)


def translate_psycopg2(
    exc: BaseException,
    scope: str | None = None,
    key: str | None = None,
    *,
    waiting: bool = False,
    read_only_transient: bool = False,
) -> OnceOnlyError | None:
    """:func:`translate` for a psycopg2 error (``None``: ``exc`` is not one; psycopg2 is
    imported only when loaded already)."""
    psycopg2 = sys.modules.get("psycopg2")
    if psycopg2 is None or not isinstance(exc, psycopg2.Error):
        return None
    errors = importlib.import_module("psycopg2.errors")
    if isinstance(exc, errors.LockNotAvailable) or (
        waiting and isinstance(exc, errors.QueryCanceled)
    ):
        return InFlight(
            "another transaction holds this key and did not finish within lock_wait",
            scope=scope,
            key=key,
        )
    if isinstance(exc, errors.UndefinedTable):
        return NotMigrated(
            f"a table of the store is missing; run store.migrate() first ({exc})",
            scope=scope,
            key=key,
        )
    if isinstance(exc, errors.FeatureNotSupported) and "onceonly" in str(exc):
        # the partitioned table's refusal of another isolation level: as psycopg 3
        message = (exc.diag.message_primary or str(exc)) if exc.diag else str(exc)
        return ConfigurationError(message, scope=scope, key=key)
    if isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError)):
        return StoreUnavailable(f"PostgreSQL is unavailable: {exc}", scope=scope, key=key)
    if read_only_transient and isinstance(exc, errors.ReadOnlySqlTransaction):
        return StoreUnavailable(
            f"PostgreSQL is read-only (a failover?): {exc}", scope=scope, key=key
        )
    return StoreError(f"PostgreSQL error: {exc}", scope=scope, key=key)


def translate_statement(exc: BaseException) -> OnceOnlyError | None:
    """The store contract's ``translate``: an error of a statement the store ran through a
    session's ``execute`` in a transaction of its own (the outbox's), on psycopg 3 or
    psycopg2; ``None`` for anything else."""
    if isinstance(exc, psycopg.Error):
        return translate(exc, read_only_transient=True)
    return translate_psycopg2(exc, read_only_transient=True)


class _DriverErrors:
    """Translate psycopg and pool errors raised by the store's own statements
    (:func:`translate`; always ``raise … from exc``).
    ``waiting``: the statement may have been waiting for another transaction's lock, so a
    cancellation means that wait ran out (:class:`InFlight`).
    """

    __slots__ = ("key", "scope", "waiting")

    def __init__(
        self, scope: str | None = None, key: str | None = None, *, waiting: bool = False
    ) -> None:
        self.scope = scope
        self.key = key
        self.waiting = waiting

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, psycopg.Error):
            raise translate(exc, self.scope, self.key, waiting=self.waiting) from exc
