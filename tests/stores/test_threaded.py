# SPDX-License-Identifier: MIT
"""The async face of SQLite (``ThreadedAsyncStore``): cancellation and joined connections."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly.stores import ThreadedAsyncStore


class Ticker:
    """Measures how late a 10 ms ``asyncio.sleep`` loop wakes up: the event loop's lag."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.01)
            self.worst = max(self.worst, loop.time() - before - 0.01)

    async def __aenter__(self) -> Ticker:
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(0.02)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


@pytest.fixture
async def astore(tmp_path: Path) -> AsyncIterator[ThreadedAsyncStore]:
    store = onceonly.open_async_store(f"sqlite:///{tmp_path / 'threaded.db'}")
    assert isinstance(store, ThreadedAsyncStore)
    await store.migrate()
    async with store.transaction() as s:
        await s.execute("CREATE TABLE ledger (id TEXT PRIMARY KEY)")
    yield store
    await store.close()


def _holder(store: ThreadedAsyncStore) -> sqlite3.Connection:
    """Another connection that holds the database's write lock until rolled back."""
    conn = sqlite3.connect(store.sync.path, isolation_level=None, check_same_thread=False)  # type: ignore[attr-defined]
    conn.execute("BEGIN IMMEDIATE")
    return conn


async def _ledger(store: ThreadedAsyncStore) -> list[str]:
    async with store.session() as s:
        cursor = await s.execute("SELECT id FROM ledger ORDER BY id")
        return [row[0] for row in await cursor.fetchall()]


async def _write(store: ThreadedAsyncStore, ident: str, *, lock_wait: float = 5.0) -> None:
    async with store.transaction(lock_wait=lock_wait) as s:
        await s.execute("INSERT INTO ledger (id) VALUES (?)", (ident,))
        await asyncio.sleep(30)  # only cancellation gets past this


async def _eventually_writable(store: ThreadedAsyncStore, ident: str) -> None:
    """A later transaction gets the write lock and commits (nothing was leaked)."""
    async with store.transaction(lock_wait=5.0) as s:
        await s.execute("INSERT INTO ledger (id) VALUES (?)", (ident,))


async def test_cancel_while_waiting_for_the_write_lock_keeps_the_loop_running(
    astore: ThreadedAsyncStore,
) -> None:
    """Cancelling a task blocked in BEGIN IMMEDIATE returns at once; the loop never stalls."""
    holder = _holder(astore)
    try:
        async with Ticker() as ticker:
            started = time.monotonic()
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(_write(astore, "cancelled", lock_wait=2.0), 0.1)
            assert time.monotonic() - started < 0.5
            await asyncio.sleep(0.2)
        assert ticker.worst < 0.1, f"the event loop stalled for {ticker.worst:.3f}s"
    finally:
        holder.rollback()
        holder.close()
    await _eventually_writable(astore, "later")
    assert await _ledger(astore) == ["later"]


async def test_cancelled_claim_that_gets_the_lock_later_is_rolled_back_on_its_thread(
    astore: ThreadedAsyncStore,
) -> None:
    """The lock freed after the cancel: the late BEGIN is rolled back, never left open."""
    holder = _holder(astore)
    release = threading.Timer(0.3, holder.rollback)
    release.start()
    try:
        async with Ticker() as ticker:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(_write(astore, "cancelled", lock_wait=5.0), 0.1)
            await asyncio.sleep(0.5)  # the worker thread gets the lock meanwhile
        assert ticker.worst < 0.1, f"the event loop stalled for {ticker.worst:.3f}s"
    finally:
        release.join()
        holder.close()
    await _eventually_writable(astore, "later")
    assert await _ledger(astore) == ["later"]
    assert all(not c.in_transaction for c in astore.sync._pool)  # type: ignore[attr-defined]


async def test_cancel_inside_the_transaction_commits_nothing(astore: ThreadedAsyncStore) -> None:
    """A task cancelled after its first write rolls it back; the next writer proceeds."""
    async with Ticker() as ticker:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(_write(astore, "cancelled"), 0.1)
    assert ticker.worst < 0.1
    await _eventually_writable(astore, "later")
    assert await _ledger(astore) == ["later"]


async def test_cancel_during_a_slow_statement_keeps_the_loop_running(
    astore: ThreadedAsyncStore,
) -> None:
    """A statement still running on the thread finishes there, then rolls back."""

    async def slow() -> None:
        async with astore.transaction() as s:
            s.connection.create_function("pause", 1, lambda x: time.sleep(x) or 0)
            await s.execute("INSERT INTO ledger (id) VALUES ('cancelled')")
            await s.execute("SELECT pause(0.5)")

    async with Ticker() as ticker:
        started = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(slow(), 0.1)
        assert time.monotonic() - started < 0.4
    assert ticker.worst < 0.1
    await _eventually_writable(astore, "later")
    assert await _ledger(astore) == ["later"]


async def test_an_error_inside_the_transaction_is_rolled_back_before_it_propagates(
    astore: ThreadedAsyncStore,
) -> None:
    """An ordinary exception waits for the rollback, so the caller can write straight after."""
    with pytest.raises(RuntimeError, match="boom"):
        async with astore.transaction() as s:
            await s.execute("INSERT INTO ledger (id) VALUES ('failed')")
            raise RuntimeError("boom")
    async with astore.transaction(lock_wait=0.05) as s:  # no wait: the lock is free
        await s.execute("INSERT INTO ledger (id) VALUES ('next')")
    assert await _ledger(astore) == ["next"]


# -- a caller's own sqlite3.Connection, joined from the async face


def _caller_connection(store: ThreadedAsyncStore, **kwargs: Any) -> sqlite3.Connection:
    conn = sqlite3.connect(store.sync.path, isolation_level=None, **kwargs)  # type: ignore[attr-defined]
    conn.execute("BEGIN")
    conn.execute("INSERT INTO ledger (id) VALUES ('mine')")
    return conn


async def _handler(payload: Any, tx: onceonly.AsyncTx) -> str:
    await tx.execute("INSERT INTO ledger (id) VALUES (?)", (payload["id"],))
    return "done"


async def test_async_inbox_joins_a_connection_opened_for_any_thread(
    astore: ThreadedAsyncStore,
) -> None:
    """With check_same_thread=False, the claim and the handler join the caller's transaction."""
    conn = _caller_connection(astore, check_same_thread=False)
    inbox = onceonly.AsyncInbox(astore, consumer="c")
    out = await inbox.process("k", {"id": "o-1"}, _handler, connection=conn)
    assert (out.result, out.replayed) == ("done", False)
    assert conn.in_transaction  # never committed by onceonly
    conn.execute("COMMIT")
    assert await _ledger(astore) == ["mine", "o-1"]
    again = await inbox.process("k", {"id": "o-1"}, _handler)
    assert (again.result, again.replayed) == ("done", True)
    conn.close()


async def test_async_inbox_joined_failure_rolls_back_to_the_savepoint(
    astore: ThreadedAsyncStore,
) -> None:
    """A failing handler undoes its own writes only; the caller's transaction goes on."""
    conn = _caller_connection(astore, check_same_thread=False)
    inbox = onceonly.AsyncInbox(astore, consumer="c")

    async def bad(payload: Any, tx: onceonly.AsyncTx) -> None:
        await tx.execute("INSERT INTO ledger (id) VALUES ('handler')")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await inbox.process("k", {}, bad, connection=conn)
    assert [r[0] for r in conn.execute("SELECT id FROM ledger")] == ["mine"]
    conn.execute("COMMIT")
    conn.close()


async def test_async_inbox_refuses_a_connection_bound_to_its_thread(
    astore: ThreadedAsyncStore,
) -> None:
    """A default sqlite3 connection gets a ConfigurationError saying what to do."""
    conn = _caller_connection(astore)
    inbox = onceonly.AsyncInbox(astore, consumer="c")
    with pytest.raises(onceonly.ConfigurationError, match="check_same_thread=False"):
        await inbox.process("k", {"id": "o-1"}, _handler, connection=conn)
    assert [r[0] for r in conn.execute("SELECT id FROM ledger")] == ["mine"]
    conn.execute("ROLLBACK")
    conn.close()
    assert await _ledger(astore) == []


async def test_async_inbox_refuses_a_closed_connection(astore: ThreadedAsyncStore) -> None:
    """A closed sqlite3 connection is a ConfigurationError, not a raw driver error."""
    conn = sqlite3.connect(astore.sync.path, check_same_thread=False)  # type: ignore[attr-defined]
    conn.close()
    inbox = onceonly.AsyncInbox(astore, consumer="c")
    with pytest.raises(onceonly.ConfigurationError, match="closed"):
        await inbox.process("k", {"id": "o-1"}, _handler, connection=conn)
