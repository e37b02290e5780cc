# SPDX-License-Identifier: MIT
"""The statements the SQLite store sends per message (traced on the connection).

A new key costs one statement more than a hand-written transaction (``BEGIN
IMMEDIATE``, an ``INSERT … ON CONFLICT DO NOTHING RETURNING`` of the key, the business
insert, ``COMMIT``): the claim reads the key (the transaction holds the write lock, so
the read decides) and the record is written once, completed, by one insert after the
handler; no update of a row inserted moments before, no ``RETURNING``, no read-back, and
the busy timeout is set only when it changes. A replay reads the record and commits
nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onceonly


def traced(tmp_path: Path) -> tuple[Any, Any, list[str]]:
    store: Any = onceonly.open_store(f"sqlite:///{tmp_path / 's.db'}", migrate=True)
    with store.transaction() as s:
        s.execute("CREATE TABLE ledger (id TEXT)")
    inbox = onceonly.Inbox(store, "c")

    def handler(payload: str, tx: onceonly.Tx) -> None:
        tx.execute("INSERT INTO ledger (id) VALUES (?)", (payload,))

    inbox.process("warm", "warm", handler)  # the pooled connection and its busy timeout
    with store.transaction() as s:
        conn = s.connection
    seen: list[str] = []
    conn.set_trace_callback(lambda sql: seen.append(" ".join(sql.split()[:3])))
    return store, lambda key: inbox.process(key, key, handler), seen


def test_statements_per_message(tmp_path: Path) -> None:
    """New key: BEGIN, read of the key, handler insert, the completed record's insert,
    COMMIT (5; the hand-written transaction sends 4). Replay: BEGIN, read, COMMIT (3)."""
    store, process, seen = traced(tmp_path)
    try:
        assert not process("k").replayed
        new, seen[:] = list(seen), []
        assert process("k").replayed
        replay = list(seen)
    finally:
        store.close()
    assert new == [
        "BEGIN IMMEDIATE",
        "SELECT scope, key,",
        "INSERT INTO ledger",
        "INSERT INTO onceonly_records",
        "COMMIT",
    ]
    assert replay == ["BEGIN IMMEDIATE", "SELECT scope, key,", "COMMIT"]
    with store.session() as s:
        row = s.execute("SELECT state, result, completed_at FROM onceonly_records").fetchall()
    assert [(r[0], r[1]) for r in row] == [("completed", "null")] * 2
