# SPDX-License-Identifier: MIT
"""The SQLite store's rows and errors (no connections): records from rows, the values
a Write stores, and the translation of sqlite3 errors raised by the store's own
statements."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from onceonly._core.state import Record, State, Write
from onceonly.errors import (
    ConfigurationError,
    InFlight,
    NotMigrated,
    OnceOnlyError,
    StoreError,
    StoreUnavailable,
)

__all__ = [
    "_COLUMNS",
    "_busy_timeout_ms",
    "_errors",
    "_in_transaction",
    "_insert_values",
    "_record",
    "_row_values",
    "_translate",
    "_update_values",
    "_written",
]

_MAX_BUSY_MS = 2**31 - 1
_COLUMNS = (
    "scope, key, state, fingerprint, token, attempts, lease_until, result, error, payload, "
    "checkpoint, created_at, updated_at, completed_at, expires_at"
)


def _record(row: Sequence[Any]) -> Record:
    return Record(
        scope=row[0],
        key=row[1],
        state=State.parse(row[2], key=row[1]),
        fingerprint=row[3],
        token=row[4],
        attempts=row[5],
        lease_until=row[6],
        result=row[7],
        error=row[8],
        payload=row[9],
        checkpoint=row[10],
        created_at=row[11],
        updated_at=row[12],
        completed_at=row[13],
        expires_at=row[14],
    )


# State.value is a property (slow on the hot path); the text of each state, by state.
_STATE_TEXT = {state: state.value for state in State}


def _insert_values(
    scope: str, key: str, write: Write, now: float, created: float | None = None
) -> tuple[Any, ...]:
    """The bound values of ``insert``: scope, key, created_at (``created``, default
    ``now``), then ``_row_values``."""
    return (scope, key, now if created is None else created, *_row_values(write, now))


def _row_values(write: Write, now: float) -> tuple[Any, ...]:
    """state .. expires_at without scope/key/created_at, stamped at ``now``."""
    return (
        _STATE_TEXT[write.state],
        write.fingerprint,
        write.token,
        write.attempts,
        None if write.lease_seconds is None else now + write.lease_seconds,
        write.result,
        write.error,
        write.payload,
        write.checkpoint,
        now,
        now if write.completed else None,
        None if write.ttl_seconds is None else now + write.ttl_seconds,
    )


def _update_values(write: Write, now: float) -> tuple[Any, ...]:
    """The SET values of ``update``: ``_row_values`` with ``keep_checkpoint`` before the
    checkpoint (``CASE WHEN keep THEN checkpoint ELSE ? END``)."""
    values = _row_values(write, now)
    return (*values[:8], write.keep_checkpoint, *values[8:])


def _written(
    scope: str, key: str, write: Write, now: float, created: float | None = None
) -> Record:
    """The record an insert of ``write`` at ``now`` stored (what ``RETURNING`` would read
    back: the same values, so the statement needs no ``RETURNING``); ``created``: its
    ``created_at`` when not ``now``."""
    return Record(
        scope,
        key,
        write.state,
        write.fingerprint,
        write.token,
        write.attempts,
        None if write.lease_seconds is None else now + write.lease_seconds,
        write.result,
        write.error,
        write.payload,
        write.checkpoint,
        now if created is None else created,
        now,
        now if write.completed else None,
        None if write.ttl_seconds is None else now + write.ttl_seconds,
    )


def _translate(exc: sqlite3.Error, *, begin: bool = False) -> OnceOnlyError:
    """The error to raise (``from exc``) for a sqlite3 error of the store's own statements."""
    if isinstance(exc, sqlite3.ProgrammingError) and "closed database" in str(exc):
        # the connection was closed (by a handler, through tx.connection): nothing of
        # its transaction committed; the next one runs on a fresh connection
        return StoreUnavailable(f"the SQLite connection was closed: {exc}")
    if "file is not a database" in str(exc):  # SQLITE_NOTADB
        # the URL names a file that is not a SQLite database: retrying cannot help
        return ConfigurationError(f"the store's file is not a SQLite database ({exc})")
    if not isinstance(exc, sqlite3.OperationalError):
        return StoreError(f"SQLite failed: {exc}")
    text = str(exc)
    if "locked" in text or "busy" in text:
        if begin:
            return InFlight(
                "the database write lock was held longer than the wait (a concurrent "
                "delivery is running); retry later"
            )
        return StoreUnavailable(f"SQLite is busy: {text}")
    if "unable to open" in text or "disk I/O" in text:
        return StoreUnavailable(f"SQLite is unavailable: {text}")
    if text.startswith("no such table"):
        # only the store's own statements come through here, never the handler's
        return NotMigrated(f"a table of the store is missing; run store.migrate() first ({text})")
    return StoreError(f"SQLite failed: {text}")


def _in_transaction(conn: sqlite3.Connection) -> bool | None:
    """``conn.in_transaction``, or ``None`` when the connection is closed (the getter
    raises ``ProgrammingError`` for nothing else)."""
    try:
        return conn.in_transaction
    except sqlite3.ProgrammingError:
        return None


@contextmanager
def _errors(*, begin: bool = False) -> Iterator[None]:
    """Translate sqlite3 errors raised by the store's own statements."""
    try:
        yield
    except sqlite3.Error as exc:
        raise _translate(exc, begin=begin) from exc


def _busy_timeout_ms(lock_wait: float) -> int:
    """``lock_wait`` seconds as SQLite's busy timeout (an int of milliseconds; inf: the max)."""
    if math.isnan(lock_wait) or lock_wait < 0:
        raise ConfigurationError(f"lock_wait must be a number of seconds, not {lock_wait!r}")
    return _MAX_BUSY_MS if math.isinf(lock_wait) else min(int(lock_wait * 1000), _MAX_BUSY_MS)
