# SPDX-License-Identifier: MIT
"""SQLite edges: a handler that closes ``tx.connection`` (spec §1.3.1, health ``lost``),
and ``precount_attempts`` in a transaction the inbox joins (spec §1.3.3)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly.stores.sqlite import SQLiteStore


def _store(tmp_path: Path, name: str) -> SQLiteStore:
    # a short lock wait: a precount that waits on its own write lock fails fast
    store = onceonly.open_store(f"sqlite:///{tmp_path / name}?timeout=0.5")
    store.migrate()
    assert isinstance(store, SQLiteStore)
    return store


def _attempts(store: SQLiteStore, scope: str, key: str) -> int:
    record = onceonly.Admin(store).show(scope, key)
    return 0 if record is None else record.attempts


def _close(payload: Any, tx: onceonly.Tx) -> str:
    tx.connection.close()
    return "ran"


# -- a handler that closes tx.connection: StoreUnavailable, not counted (§1.3.1)


@pytest.mark.parametrize("batch", [False, True])
def test_handler_closing_the_connection_is_unavailable_and_uncounted(
    tmp_path: Path, batch: bool
) -> None:
    """Inbox: a closed tx.connection gives StoreUnavailable, no attempt, a fresh next run."""
    store = _store(tmp_path, "close.db")
    inbox = onceonly.Inbox(store, consumer="c")
    with pytest.raises(onceonly.StoreUnavailable):
        if batch:
            inbox.process_batch([("k", {})], _close)
        else:
            inbox.process("k", {}, _close)
    assert onceonly.Admin(store).show("c", "k") is None  # nothing committed, not counted
    again = inbox.process("k", {}, lambda p, tx: tx.execute("SELECT 1").fetchone()[0])
    assert again.result == 1 and not again.replayed


@pytest.mark.parametrize("batch", [False, True])
def test_async_handler_closing_the_connection_is_unavailable_and_uncounted(
    tmp_path: Path, batch: bool
) -> None:
    """AsyncInbox: the same over the threaded SQLite store."""
    path = tmp_path / "aclose.db"
    _store(tmp_path, "aclose.db")

    async def close(payload: Any, tx: onceonly.AsyncTx) -> str:
        tx.connection.close()
        return "ran"

    async def ok(payload: Any, tx: onceonly.AsyncTx) -> int:
        row = await (await tx.execute("SELECT 1")).fetchone()
        return int(row[0])

    async def main() -> onceonly.Outcome[int]:
        store = onceonly.open_async_store(f"sqlite:///{path}")
        inbox = onceonly.AsyncInbox(store, consumer="c")
        with pytest.raises(onceonly.StoreUnavailable):
            if batch:
                await inbox.process_batch([("k", {})], close)
            else:
                await inbox.process("k", {}, close)
        return await inbox.process("k", {}, ok)

    again = asyncio.run(main())
    assert again.result == 1 and not again.replayed
    assert _attempts(_store(tmp_path, "aclose.db"), "c", "k") == 0


def test_handler_closing_a_callers_connection_is_unavailable(tmp_path: Path) -> None:
    """A caller's connection closed by the handler inside the savepoint: StoreUnavailable."""
    store = _store(tmp_path, "caller.db")
    inbox = onceonly.Inbox(store, consumer="c")
    conn = sqlite3.connect(tmp_path / "caller.db", isolation_level=None)
    conn.execute("BEGIN")
    with pytest.raises(onceonly.StoreUnavailable):
        inbox.process("k", {}, _close, connection=conn)
    assert onceonly.Admin(store).show("c", "k") is None


def test_a_connection_closed_after_its_transaction_is_not_reused(tmp_path: Path) -> None:
    """A tx.connection kept and closed after the run leaves the pool: the next runs work."""
    store = _store(tmp_path, "kept.db")
    inbox = onceonly.Inbox(store, consumer="c")
    kept: list[sqlite3.Connection] = []
    inbox.process("a", {}, lambda p, tx: kept.append(tx.connection))
    kept[0].close()
    assert inbox.process("b", {}, lambda p, tx: 2).result == 2
    assert inbox.process("a", {}, lambda p, tx: 3).replayed


def test_translate_maps_a_closed_connection_to_unavailable(tmp_path: Path) -> None:
    """The store's driver-error table: a closed connection is transient."""
    store = _store(tmp_path, "translate.db")
    conn = sqlite3.connect(":memory:")
    conn.close()
    with pytest.raises(sqlite3.ProgrammingError) as raised:
        conn.execute("SELECT 1")
    assert isinstance(store.translate(raised.value), onceonly.StoreUnavailable)


# -- precount_attempts in a joined SQLite transaction (§1.3.3)


def test_precounted_batch_completes(tmp_path: Path) -> None:
    """process_batch with precount_attempts on SQLite runs each message as process would."""
    store = _store(tmp_path, "pcb.db")
    inbox = onceonly.Inbox(store, consumer="c", precount_attempts=True)

    def handler(payload: str, tx: onceonly.Tx) -> str:
        if payload == "bad":
            raise ValueError("bad")
        return payload

    outs = inbox.process_batch([("k1", "a"), ("k2", "bad"), ("k3", "c")], handler)
    assert [(o.result, o.replayed) for o in outs] == [("a", False), (None, False), ("c", False)]
    assert isinstance(outs[1].error, ValueError)
    assert _attempts(store, "c", "k2") == 1  # counted once, in the batch's transaction
    assert inbox.process("k1", "a", handler).replayed


def test_async_precounted_batch_completes(tmp_path: Path) -> None:
    """AsyncInbox: the same over the threaded SQLite store."""
    path = tmp_path / "apcb.db"
    _store(tmp_path, "apcb.db")

    async def handler(payload: str, tx: onceonly.AsyncTx) -> str:
        return payload

    async def main() -> list[onceonly.Outcome[str]]:
        store = onceonly.open_async_store(f"sqlite:///{path}?timeout=0.5")
        inbox = onceonly.AsyncInbox(store, consumer="c", precount_attempts=True)
        return await inbox.process_batch([("k1", "a"), ("k2", "b")], handler)

    outs = asyncio.run(main())
    assert [(o.result, o.replayed, o.error) for o in outs] == [
        ("a", False, None),
        ("b", False, None),
    ]


def test_precount_joined_to_a_callers_written_transaction(tmp_path: Path) -> None:
    """process(connection=...) with precount_attempts, after the caller wrote: it runs,
    and the claim commits (or rolls back) with the caller's writes."""
    store = _store(tmp_path, "pcc.db")
    with store.transaction() as tx:
        tx.execute("CREATE TABLE biz (x)")
    inbox = onceonly.Inbox(store, consumer="c", precount_attempts=True)
    conn = sqlite3.connect(tmp_path / "pcc.db", isolation_level=None)
    conn.execute("BEGIN")
    conn.execute("INSERT INTO biz VALUES (1)")  # holds the database's write lock
    out = inbox.process("k", 1, lambda m, tx: m, connection=conn)
    assert out.result == 1 and not out.replayed
    conn.execute("ROLLBACK")
    assert onceonly.Admin(store).show("c", "k") is None  # rolled back with the caller's
    conn.execute("BEGIN")
    conn.execute("INSERT INTO biz VALUES (1)")
    assert inbox.process("k", 1, lambda m, tx: m, connection=conn).result == 1
    conn.execute("COMMIT")
    assert inbox.process("k", 1, lambda m, tx: m).replayed


@pytest.mark.parametrize("batch", [False, True])
def test_engine_store_handler_closing_the_connection(tmp_path: Path, batch: bool) -> None:
    """Over a SQLAlchemy engine: StoreUnavailable, and the engine replaces the connection."""
    sqlalchemy = pytest.importorskip("sqlalchemy")
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'engine.db'}")
    store = onceonly.open_store(engine)
    store.migrate()
    inbox = onceonly.Inbox(store, consumer="c")
    with pytest.raises(onceonly.StoreUnavailable):
        if batch:
            inbox.process_batch([("k", {})], _close)
        else:
            inbox.process("k", {}, _close)
    again = inbox.process("k", {}, lambda p, tx: tx.execute("SELECT 1").fetchone()[0])
    assert again.result == 1 and not again.replayed
    engine.dispose()


def test_async_precount_joined_to_a_callers_written_transaction(tmp_path: Path) -> None:
    """AsyncInbox: process(connection=...) with precount_attempts after the caller wrote."""
    store = _store(tmp_path, "apcc.db")
    with store.transaction() as tx:
        tx.execute("CREATE TABLE biz (x)")
    conn = sqlite3.connect(tmp_path / "apcc.db", isolation_level=None, check_same_thread=False)

    async def handler(payload: int, tx: onceonly.AsyncTx) -> int:
        return payload

    async def main() -> onceonly.Outcome[int]:
        astore = onceonly.open_async_store(f"sqlite:///{tmp_path / 'apcc.db'}?timeout=0.5")
        inbox = onceonly.AsyncInbox(astore, consumer="c", precount_attempts=True)
        conn.execute("BEGIN")
        conn.execute("INSERT INTO biz VALUES (1)")  # holds the database's write lock
        out = await inbox.process("k", 1, handler, connection=conn)
        conn.execute("COMMIT")
        return out

    out = asyncio.run(main())
    assert out.result == 1 and not out.replayed
    record = onceonly.Admin(store).show("c", "k")
    assert record is not None and record.state.value == "completed"
