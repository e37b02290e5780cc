# SPDX-License-Identifier: MIT
"""A caller's own connection: the claim joins its transaction and never commits it."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import onceonly

Joined = tuple[Any, sqlite3.Connection]


@pytest.fixture
def joined(tmp_path: Path) -> Iterator[Joined]:
    """A store and the caller's own connection to the same SQLite file."""
    path = tmp_path / "join.db"
    store = onceonly.open_store(f"sqlite:///{path}")
    store.migrate()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE orders (id TEXT)")
    yield store, conn
    # closed, not left to the garbage collector (Python 3.13 warns about that)
    conn.close()
    store.close()


def test_claim_rolls_back_with_the_caller(joined: Joined) -> None:
    """If the caller rolls back, the claim and the handler's writes vanish together."""
    store, conn = joined
    inbox = onceonly.Inbox(store, consumer="c")
    conn.execute("BEGIN")
    conn.execute("INSERT INTO orders VALUES ('o-1')")
    out = inbox.process(
        "k",
        {},
        lambda p, tx: tx.execute("INSERT INTO orders VALUES ('o-2')") and 1,
        connection=conn,
    )
    assert out.replayed is False
    conn.execute("ROLLBACK")
    assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 0
    assert inbox.process("k", {}, lambda p, tx: 2).result == 2  # the claim was undone too


def test_claim_commits_with_the_caller(joined: Joined) -> None:
    """When the caller commits, the key is completed and replays."""
    store, conn = joined
    inbox = onceonly.Inbox(store, consumer="c")
    conn.execute("BEGIN")
    inbox.process("k", {}, lambda p, tx: "done", connection=conn)
    assert conn.in_transaction  # not committed by onceonly
    conn.execute("COMMIT")
    assert inbox.process("k", {}, lambda p, tx: "other").result == "done"


def test_failure_inside_caller_transaction_rolls_back_to_savepoint(joined: Joined) -> None:
    """A failing handler undoes only its own writes; the caller's earlier writes stay."""
    store, conn = joined
    inbox = onceonly.Inbox(store, consumer="c")
    conn.execute("BEGIN")
    conn.execute("INSERT INTO orders VALUES ('mine')")

    def bad(p: Any, tx: onceonly.Tx) -> None:
        tx.execute("INSERT INTO orders VALUES ('handler')")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        inbox.process("k", {}, bad, connection=conn)
    assert [r[0] for r in conn.execute("SELECT id FROM orders")] == ["mine"]
    conn.execute("COMMIT")


def test_connection_outside_a_transaction_is_refused(joined: Joined) -> None:
    """A connection that is not inside a transaction raises ConfigurationError."""
    store, conn = joined
    inbox = onceonly.Inbox(store, consumer="c")
    with pytest.raises(onceonly.ConfigurationError, match="not inside a transaction"):
        inbox.process("k", {}, lambda p, tx: 1, connection=conn)
