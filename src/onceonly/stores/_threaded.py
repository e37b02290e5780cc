# SPDX-License-Identifier: MIT
"""An async face for a sync store (SQLite, memory): every operation runs in a thread.

Invariants:

* A transaction (or session) is pinned to one worker thread for its whole life,
  because a SQLite connection inside a transaction belongs to the thread that began it
  and because the memory store holds per-key locks across the transaction.
* The event loop never waits for that thread: not on entry (``BEGIN IMMEDIATE`` may
  wait ``lock_wait`` for SQLite's write lock), not on exit, not on cancellation.
* A cancelled task does not wait for its thread either: the rollback is queued behind
  whatever the thread is still running (a statement, or the ``BEGIN`` it was waiting
  on) and runs there, so the connection goes back to the pool without an open
  transaction. An ordinary exception waits for the rollback, so the caller can write
  again at once.
* A caller's ``sqlite3.Connection`` is used from the worker thread, so it must be
  opened with ``check_same_thread=False``; otherwise :class:`~onceonly.ConfigurationError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from onceonly._core.state import Expect, Record, Write
from onceonly.errors import ConfigurationError, OnceOnlyError
from onceonly.stores._threaded_admin import ThreadedAdmin
from onceonly.types import (
    AsyncListener,
    OutboxStatements,
    Params,
    Session,
    Snapshot,
    Store,
    TxHealth,
)

__all__ = ["ThreadedAsyncStore"]

T = TypeVar("T")

log = logging.getLogger(__name__)


class ThreadedAsyncCursor:
    """A DB-API cursor whose fetches run on the session's thread."""

    def __init__(self, cursor: Any, run: Callable[..., Any]) -> None:
        self._cursor = cursor
        self._run = run

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    async def fetchone(self) -> Any:
        return await self._run(self._cursor.fetchone)

    async def fetchall(self) -> list[Any]:
        rows: list[Any] = await self._run(self._cursor.fetchall)
        return rows


class ThreadedAsyncSession:
    """The async methods of a sync session, each run on the session's own thread."""

    def __init__(self, session: Session, executor: concurrent.futures.Executor) -> None:
        self._session = session
        self._executor = executor

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    @property
    def connection(self) -> Any:
        return self._session.connection

    async def execute(self, sql: str, params: Params = None) -> ThreadedAsyncCursor:
        cursor = await self._run(self._session.execute, sql, params)
        return ThreadedAsyncCursor(cursor, self._run)

    def health(self) -> TxHealth:
        return self._session.health()

    async def claim(self, scope: str, key: str, write: Write) -> Snapshot:
        return await self._run(self._session.claim, scope, key, write)

    async def get(self, scope: str, key: str) -> Snapshot:
        return await self._run(self._session.get, scope, key)

    async def update(self, scope: str, key: str, expect: Expect, write: Write) -> Record | None:
        return await self._run(self._session.update, scope, key, expect, write)

    async def insert(self, scope: str, key: str, write: Write) -> Record | None:
        return await self._run(self._session.insert, scope, key, write)

    async def renew(self, scope: str, key: str, token: int, lease_seconds: float) -> float | None:
        return await self._run(self._session.renew, scope, key, token, lease_seconds)

    async def save_checkpoint(
        self, scope: str, key: str, token: int, checkpoint: str, lease_seconds: float | None = None
    ) -> bool:
        return await self._run(
            self._session.save_checkpoint, scope, key, token, checkpoint, lease_seconds
        )


class ThreadedAsyncStore:
    """Wraps a sync :class:`~onceonly.types.Store` as an :class:`~onceonly.types.AsyncStore`."""

    def __init__(self, store: Store) -> None:
        self.sync = store
        self.url = store.url
        self.atomic = store.atomic
        self.dialect = store.dialect
        self.table: str | None = getattr(store, "table", None)  # a SQL store's records table
        self.outbox_table = store.outbox_table
        self.latest_schema_version = store.latest_schema_version
        self.replay_cache = store.replay_cache  # no I/O: the same for sync and async

    @property
    def connection_source(self) -> Hashable:
        """The wrapped store's.

        See :attr:`onceonly.types.Store.connection_source`.
        """
        return self.sync.connection_source

    async def migrate(self) -> None:
        await asyncio.to_thread(self.sync.migrate)

    async def schema_version(self) -> int | None:
        return await asyncio.to_thread(self.sync.schema_version)

    @property
    def pool_size(self) -> int | None:
        """The wrapped store's."""
        return self.sync.pool_size

    def admin(self) -> ThreadedAdmin:
        """The wrapped store's operator access, each call in a worker thread."""
        return ThreadedAdmin(self.sync.admin())

    def outbox_statements(self, table: str) -> OutboxStatements:
        """The wrapped store's."""
        return self.sync.outbox_statements(table)

    def translate(self, exc: BaseException) -> OnceOnlyError | None:
        """The wrapped store's (the statements run on its connections)."""
        return self.sync.translate(exc)

    async def listen(self, channel: str) -> AsyncListener | None:
        """``None``: the relay polls (the wrapped stores, SQLite and memory, send no
        notifications)."""
        return None

    async def renew_connections(self) -> None:
        await asyncio.to_thread(self.sync.renew_connections)

    @asynccontextmanager
    async def _pinned(
        self, factory: Callable[[], Any], connection: Any = None
    ) -> AsyncIterator[ThreadedAsyncSession]:
        # Not ``with ThreadPoolExecutor()``: its exit joins the thread on the event loop.
        executor = concurrent.futures.ThreadPoolExecutor(1, "onceonly-store")
        try:
            cm = factory()
            entering = executor.submit(_enter, cm, connection)
            try:
                session = await asyncio.wrap_future(entering)
            except asyncio.CancelledError:
                executor.submit(_abandon, cm, entering)
                raise
            try:
                yield ThreadedAsyncSession(session, executor)
            except asyncio.CancelledError as exc:
                executor.submit(_exit_quietly, cm, exc)
                raise
            except BaseException as exc:
                exiting = executor.submit(cm.__exit__, type(exc), exc, exc.__traceback__)
                if not await asyncio.shield(asyncio.wrap_future(exiting)):
                    raise
            else:
                exiting = executor.submit(cm.__exit__, None, None, None)
                await asyncio.shield(asyncio.wrap_future(exiting))
        finally:
            executor.shutdown(wait=False)  # the thread ends once its queue is done

    def transaction(self, connection: Any = None, *, lock_wait: float = 5.0) -> Any:
        return self._pinned(
            lambda: self.sync.transaction(connection, lock_wait=lock_wait), connection
        )

    def session(self) -> Any:
        return self._pinned(self.sync.session)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)


def _enter(cm: Any, connection: Any) -> Any:
    """Enter ``cm`` on the worker thread, after checking that a caller's connection may
    be used there."""
    if isinstance(connection, sqlite3.Connection):
        try:
            connection.cursor().close()
        except sqlite3.ProgrammingError as exc:
            if "thread" in str(exc):
                raise ConfigurationError(
                    "the async face of the SQLite store runs your connection's statements "
                    "on a worker thread: open the connection with "
                    "sqlite3.connect(..., check_same_thread=False)"
                ) from exc
            raise ConfigurationError(f"the connection passed in is unusable: {exc}") from exc
    return cm.__enter__()


def _abandon(cm: Any, entering: concurrent.futures.Future[Any]) -> None:
    """Run on the worker thread after ``entering``: undo an entry nobody awaits any more."""
    if entering.cancelled() or entering.exception() is not None:
        return
    _exit_quietly(cm, asyncio.CancelledError())


def _exit_quietly(cm: Any, exc: BaseException) -> None:
    """Exit ``cm`` with ``exc`` (rolling it back) on the worker thread; nobody awaits it."""
    try:
        cm.__exit__(type(exc), exc, exc.__traceback__)
    except BaseException as err:
        if err is not exc:
            log.warning("rolling back a cancelled transaction failed", exc_info=err)


if TYPE_CHECKING:  # the contract is checked statically
    from onceonly.types import AsyncStore

    _contract: type[AsyncStore] = ThreadedAsyncStore
