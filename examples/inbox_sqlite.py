# SPDX-License-Identifier: MIT
"""The README's inbox quick start, runnable: python examples/inbox_sqlite.py [DB]."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import onceonly


def main(path: str) -> None:
    store = onceonly.open_store(f"sqlite:///{path}")
    store.migrate()  # safe to repeat
    with store.transaction() as tx:
        tx.execute("CREATE TABLE IF NOT EXISTS ledger (id TEXT, amount INTEGER)")

    inbox = onceonly.Inbox(store, consumer="billing")

    @inbox.handler(key=lambda msg: msg["id"])
    def on_payment(msg: dict[str, Any], tx: onceonly.Tx) -> dict[str, int]:
        # tx.execute runs in the same transaction as the claim: both commit, or neither
        tx.execute("INSERT INTO ledger (id, amount) VALUES (?, ?)", (msg["id"], msg["amount"]))
        tx.publish("receipts", {"id": msg["id"]})  # an outbox row, same transaction
        return {"charged": msg["amount"]}

    first = on_payment({"id": "evt-1", "amount": 500})
    again = on_payment({"id": "evt-1", "amount": 500})  # the broker redelivered it
    with store.session() as s:
        rows = s.execute("SELECT count(*) FROM ledger").fetchone()[0]
    print(f"first: {first.result} replayed={first.replayed}")
    print(f"again: {again.result} replayed={again.replayed}")
    print(f"ledger rows: {rows}; outbox: {onceonly.Outbox(store).counts()}")
    store.close()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as d:
            main(str(Path(d) / "onceonly.db"))
