# SPDX-License-Identifier: MIT
"""Joining a SQLAlchemy 2 ``Session``/``Connection`` (or their asyncio forms) in atomic
mode: the claim runs on the session's own driver connection, inside its transaction.

SQLAlchemy begins transactions lazily: a ``Session`` inside ``session.begin()`` (or with
autobegin) has no database transaction until its first statement. That counts as begun
here: the session's connection is taken (``session.connection()``, never a second one)
and the database transaction is opened on it the way the driver would have done for the
next statement (a ``sqlite3`` connection gets its ``BEGIN``; psycopg, psycopg2, PyMySQL
and aiomysql with autocommit off begin it themselves with the claim's first statement).
SQLAlchemy still owns the transaction: it commits or rolls back, onceonly never does.

SQLAlchemy is imported only when a caller passes one of its objects (no dependency).
"""

from __future__ import annotations

import sqlite3
import sys
from typing import Any

from onceonly.errors import ConfigurationError

__all__ = ["join", "join_async"]


def _classes() -> tuple[Any, ...] | None:
    """SQLAlchemy's Session, Connection, AsyncSession, AsyncConnection (None if unused)."""
    if "sqlalchemy" not in sys.modules:  # nobody could have built one of its objects
        return None
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

    try:
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    except ImportError:  # no greenlet: nobody has an asyncio session either

        class AsyncConnection:  # type: ignore[no-redef]
            """A stand-in: no object is an instance of it."""

        AsyncSession = AsyncConnection  # type: ignore[misc,assignment]
    return Session, Connection, AsyncSession, AsyncConnection


def _begin_driver(driver: Any) -> Any:
    """Open the database transaction SQLAlchemy has begun lazily on ``driver``."""
    if isinstance(driver, sqlite3.Connection):
        if not driver.in_transaction:
            driver.execute("BEGIN")
        return driver
    return driver


def join(connection: Any) -> tuple[Any, Any]:
    """``(driver connection, SQLAlchemy object or None)`` for a caller's ``connection=``.

    A ``Session`` or ``Connection`` is unwrapped to the driver connection of its current
    transaction (begun now if it was not); anything else is returned as it is.
    """
    classes = _classes()
    if classes is None:
        return connection, None
    session_cls, connection_cls, async_session_cls, async_connection_cls = classes
    if isinstance(connection, (async_session_cls, async_connection_cls)):
        raise ConfigurationError("an asyncio SQLAlchemy session joins an AsyncInbox, not an Inbox")
    conn: Any
    if isinstance(connection, session_cls):
        conn = connection.connection()  # the session's own, in its (lazily begun) transaction
    elif isinstance(connection, connection_cls):
        conn = connection
        if not conn.in_transaction():
            conn.begin()  # what autobegin would do at its next statement; you commit it
    else:
        return connection, None
    return _begin_driver(conn.connection.driver_connection), connection


async def join_async(connection: Any) -> tuple[Any, Any]:
    """:func:`join` for asyncio: an ``AsyncSession`` or ``AsyncConnection``."""
    classes = _classes()
    if classes is None:
        return connection, None
    session_cls, connection_cls, async_session_cls, async_connection_cls = classes
    if isinstance(connection, (session_cls, connection_cls)):
        raise ConfigurationError("a sync SQLAlchemy session joins an Inbox, not an AsyncInbox")
    conn: Any
    if isinstance(connection, async_session_cls):
        conn = await connection.connection()
    elif isinstance(connection, async_connection_cls):
        conn = connection
        if not conn.in_transaction():
            await conn.begin()
    else:
        return connection, None
    raw = await conn.get_raw_connection()
    return _begin_driver(raw.driver_connection), connection
