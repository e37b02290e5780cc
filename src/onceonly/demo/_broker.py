# SPDX-License-Identifier: MIT
"""A small at-least-once message broker in a SQLite file.

It behaves like SQS or a RabbitMQ queue with manual acks, which is what matters here:

* ``lease`` hands the oldest visible message to one worker and hides it for the
  *visibility timeout*; every lease counts as one delivery.
* ``ack`` deletes the message, and only with the current lease's receipt.
* A worker that dies (or is slow) before acking loses nothing: when the visibility
  timeout runs out, the message is delivered again, possibly to another worker while
  the first one is still working on it.

The broker is its own file, apart from the database under test, as a real broker is.
It is durable against killed processes: SQLite releases a dead process's locks and WAL
recovery discards its uncommitted writes. Counters (deliveries, replays, retries …)
live in the same file so that every worker process can bump them.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from onceonly.demo._workload import Message

__all__ = ["Broker", "Lease"]

_SCHEMA = (
    "CREATE TABLE queue (seq INTEGER PRIMARY KEY, message_id TEXT NOT NULL,"
    " body TEXT NOT NULL, visible_at REAL NOT NULL, receipt INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE counters (name TEXT PRIMARY KEY, n INTEGER NOT NULL)",
)


@dataclass(frozen=True)
class Lease:
    """One delivery of a message: ack it with this object."""

    seq: int
    receipt: int
    message_id: str
    payload: dict[str, Any]


class Broker:
    """A connection to the queue file at ``path`` (one per process).

    Args:
        path: the queue's SQLite file.
        visibility_timeout: seconds a leased message stays hidden before redelivery.
    """

    def __init__(self, path: str, visibility_timeout: float = 1.0) -> None:
        self.path = path
        self.visibility_timeout = visibility_timeout
        self._conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        self._conn.execute("PRAGMA busy_timeout = 30000")
        self._conn.execute("PRAGMA journal_mode = WAL")
        # A killed process cannot lose a committed write even with synchronous=OFF; only
        # an operating-system crash could, and the queue is thrown away after the run.
        self._conn.execute("PRAGMA synchronous = OFF")

    @classmethod
    def create(cls, path: str, sends: Iterable[Message], visibility_timeout: float = 1.0) -> Broker:
        """Make a new queue file holding ``sends``, in order, all visible now."""
        broker = cls(path, visibility_timeout)
        conn = broker._conn
        conn.execute("BEGIN")
        for statement in _SCHEMA:
            conn.execute(statement)
        conn.executemany(
            "INSERT INTO queue (message_id, body, visible_at) VALUES (?, ?, 0)",
            ((m.id, m.to_json()) for m in sends),
        )
        conn.execute("INSERT INTO counters (name, n) VALUES ('deliveries', 0)")
        conn.execute("COMMIT")
        return broker

    def lease(self) -> Lease | None:
        """Deliver the oldest visible message, or ``None`` when none is visible."""
        conn = self._conn
        now = time.time()
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute(
                "UPDATE queue SET visible_at = ?, receipt = receipt + 1 WHERE seq ="
                " (SELECT seq FROM queue WHERE visible_at <= ? ORDER BY seq LIMIT 1)"
                " RETURNING seq, receipt, message_id, body",
                (now + self.visibility_timeout, now),
            ).fetchone()
            if row is not None:
                conn.execute("UPDATE counters SET n = n + 1 WHERE name = 'deliveries'")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if row is None:
            return None
        seq, receipt, message_id, body = row
        return Lease(int(seq), int(receipt), str(message_id), json.loads(body))

    def ack(self, lease: Lease) -> bool:
        """Delete the message if ``lease`` is still its current lease; true if deleted."""
        cur = self._conn.execute(
            "DELETE FROM queue WHERE seq = ? AND receipt = ?", (lease.seq, lease.receipt)
        )
        return cur.rowcount == 1

    def bump(self, counter: str, by: int = 1) -> None:
        """Add ``by`` to a named counter."""
        self._conn.execute(
            "INSERT INTO counters (name, n) VALUES (?, ?)"
            " ON CONFLICT (name) DO UPDATE SET n = n + excluded.n",
            (counter, by),
        )

    def remaining(self) -> int:
        """Messages not acked yet (visible or leased)."""
        row = self._conn.execute("SELECT count(*) FROM queue").fetchone()
        return int(row[0])

    def counters(self) -> dict[str, int]:
        """Every counter, ``deliveries`` included."""
        return {str(n): int(v) for n, v in self._conn.execute("SELECT name, n FROM counters")}

    def close(self) -> None:
        """Close this process's connection."""
        self._conn.close()
