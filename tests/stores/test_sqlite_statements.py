# SPDX-License-Identifier: MIT
"""The statements the SQLite store sends per message (traced on the connection).

A new key costs what a hand-written transaction costs: ``BEGIN IMMEDIATE``, the claim,
the handler's statements, ``COMMIT`` (the busy timeout is set only when it changes, and
the claim needs no ``RETURNING`` nor a read-back). A replay reads the record instead of
running the handler.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onceonly


def test_statements_per_message(tmp_path: Path) -> None:
    """New key: BEGIN, claim, handler insert, completion, COMMIT (the claim is in_progress
    until the completion, spec §1.1). Replay: BEGIN, claim, read, COMMIT."""
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
    conn.set_trace_callback(lambda sql: seen.append(" ".join(sql.split()[:2])))
    try:
        inbox.process("k", "k", handler)
        new, seen[:] = list(seen), []
        assert inbox.process("k", "k", handler).replayed
        replay = list(seen)
    finally:
        conn.set_trace_callback(None)
        store.close()
    assert new == [
        "BEGIN IMMEDIATE",
        "INSERT INTO",
        "INSERT INTO",
        "UPDATE onceonly_records",
        "COMMIT",
    ]
    assert replay == ["BEGIN IMMEDIATE", "INSERT INTO", "SELECT scope,", "COMMIT"]
