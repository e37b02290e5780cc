# SPDX-License-Identifier: MIT
"""``SQLiteStore.close()`` leaves no connection open, even one in use when it is called."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import onceonly


def test_connection_in_use_at_close_is_closed_when_given_back(tmp_path: Path) -> None:
    """A transaction still running when close() is called closes its connection after."""
    store = onceonly.open_store(f"sqlite:///{tmp_path / 'close.db'}")
    store.migrate()
    with store.transaction() as session:
        conn = session.connection
        store.close()
        session.execute("SELECT 1")  # the running transaction finishes normally
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        conn.execute("SELECT 1")


def test_store_stays_usable_after_close(tmp_path: Path) -> None:
    """A store used after close() still works (each operation opens its connection)."""
    store = onceonly.open_store(f"sqlite:///{tmp_path / 'reuse.db'}")
    store.migrate()
    store.close()
    inbox = onceonly.Inbox(store, consumer="c")
    assert inbox.process("k", {}, lambda p, tx: 1).result == 1
    assert inbox.process("k", {}, lambda p, tx: 2).replayed
    store.close()
