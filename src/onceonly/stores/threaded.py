# SPDX-License-Identifier: MIT
"""An async face for a sync store (SQLite, memory): every operation runs in a thread.

A transaction is pinned to one worker thread for its whole life, because a SQLite
connection inside a transaction belongs to the thread that began it and because the
memory store holds per-key locks across the transaction.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from onceonly._core.state import Expect, Record, Write
from onceonly.types import Params, Session, Snapshot, Store, TxHealth

__all__ = ["ThreadedAsyncStore"]

T = TypeVar("T")


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
        self.dialect: str = getattr(store, "dialect", "memory")
        self.table: str | None = getattr(store, "table", None)
        self.outbox_table: str | None = getattr(store, "outbox_table", None)

    async def migrate(self) -> None:
        await asyncio.to_thread(self.sync.migrate)

    @asynccontextmanager
    async def _pinned(self, factory: Callable[[], Any]) -> AsyncIterator[ThreadedAsyncSession]:
        loop = asyncio.get_running_loop()
        with concurrent.futures.ThreadPoolExecutor(1, "onceonly-store") as executor:
            cm = factory()
            session = await loop.run_in_executor(executor, cm.__enter__)
            try:
                yield ThreadedAsyncSession(session, executor)
            except BaseException as exc:
                if not await loop.run_in_executor(
                    executor, cm.__exit__, type(exc), exc, exc.__traceback__
                ):
                    raise
            else:
                await loop.run_in_executor(executor, cm.__exit__, None, None, None)

    def transaction(self, connection: Any = None, *, lock_wait: float = 5.0) -> Any:
        return self._pinned(lambda: self.sync.transaction(connection, lock_wait=lock_wait))

    def session(self) -> Any:
        return self._pinned(self.sync.session)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)
