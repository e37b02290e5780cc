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
    StoreUnavailable,
)

__all__ = ["_DriverErrors"]


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
            # timeout, serialization failure, deadlock: all worth a retry.
            return StoreUnavailable(f"PostgreSQL is unavailable: {exc}", scope=scope, key=key)
        return StoreError(f"PostgreSQL error: {exc}", scope=scope, key=key)
