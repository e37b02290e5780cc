# SPDX-License-Identifier: MIT
"""The one place PostgreSQL driver and pool errors become onceonly errors (shared by
the PostgreSQL store's sync and async modules; no I/O)."""

from __future__ import annotations

import psycopg
from psycopg_pool import PoolClosed

from onceonly.errors import (
    ConfigurationError,
    InFlight,
    NotMigrated,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
)

__all__ = ["_DriverErrors", "unavailable"]

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


class _DriverErrors:
    """Translate psycopg and pool errors raised by the store's own statements.

    The one place driver errors become onceonly errors (always ``raise … from exc``).
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
            raise self._translate(exc) from exc

    def _translate(self, exc: psycopg.Error) -> Exception:
        scope, key = self.scope, self.key
        if isinstance(exc, psycopg.errors.LockNotAvailable) or (
            self.waiting and isinstance(exc, psycopg.errors.QueryCanceled)
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
        return StoreError(f"PostgreSQL error: {exc}", scope=scope, key=key)
