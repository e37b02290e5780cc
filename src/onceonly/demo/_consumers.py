# SPDX-License-Identifier: MIT
"""The two consumers the demo compares; both charge a customer once per message.

* :class:`NaiveConsumer` is the check-then-act deduplication found in most codebases:
  look the message id up in a ``processed`` table, charge, then record the id, each
  statement committing on its own. A crash between the charge and the record, or two
  deliveries of one message checking at the same time, charge twice.
* :class:`OnceOnlyConsumer` hands the same charge to :class:`onceonly.Inbox`: the claim
  of the message id, the ``INSERT`` of the charge and the completion commit in one
  transaction.

``handle`` returns normally when the delivery may be acknowledged and raises
:class:`Retry` when it must be left for redelivery.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import onceonly
from onceonly.demo._database import Tables, Target, connect

__all__ = ["Consumer", "NaiveConsumer", "OnceOnlyConsumer", "Retry", "open_consumer"]


class Retry(Exception):
    """Leave the delivery unacknowledged; ``counter`` names why (for the report)."""

    def __init__(self, counter: str) -> None:
        super().__init__(counter)
        self.counter = counter


class Consumer(Protocol):
    """What a worker drives: one call per delivery."""

    def handle(self, payload: dict[str, Any]) -> str | None:
        """Process one delivery; the name of a counter to bump, if any.

        Raises:
            Retry: leave the delivery for redelivery.
        """

    def close(self) -> None:
        """Release connections."""


class NaiveConsumer:
    """Check-then-act deduplication with separate commits (the common, broken pattern)."""

    def __init__(self, target: Target, tables: Tables) -> None:
        self._db = connect(target)
        self._check = f"SELECT 1 FROM {tables.naive_processed} WHERE message_id = ?"
        self._charge = (
            f"INSERT INTO {tables.naive_charges} (message_id, customer, amount) VALUES (?, ?, ?)"
        )
        self._mark = f"INSERT INTO {tables.naive_processed} (message_id) VALUES (?)"

    def handle(self, payload: dict[str, Any]) -> str | None:
        """Skip the message if its id is recorded; otherwise charge, then record it."""
        message_id = payload["id"]
        if self._db.fetchall(self._check, (message_id,)):
            return "skipped"
        self._db.execute(self._charge, (message_id, payload["customer"], payload["amount"]))
        # A crash here leaves the charge without the mark: the redelivery charges again.
        self._db.execute(self._mark, (message_id,))
        return None

    def close(self) -> None:
        """Close the connection."""
        self._db.close()


class _Tx(Protocol):
    """The part of onceonly's handler transaction the demo uses."""

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        """Run SQL with ``?`` placeholders in the claim's transaction."""


class OnceOnlyConsumer:
    """The same charge through :class:`onceonly.Inbox` (atomic mode)."""

    def __init__(self, target: Target, tables: Tables, consumer: str) -> None:
        self._store = onceonly.open_store(target.url)
        self._inbox: onceonly.Inbox = onceonly.Inbox(self._store, consumer=consumer, ttl=3600.0)
        self._sql = (
            f"INSERT INTO {tables.onceonly_charges} (message_id, customer, amount) VALUES (?, ?, ?)"
        )

    def _charge(self, payload: dict[str, Any], tx: _Tx) -> dict[str, int]:
        tx.execute(self._sql, (payload["id"], payload["customer"], payload["amount"]))
        return {"charged": int(payload["amount"])}

    def handle(self, payload: dict[str, Any]) -> str | None:
        """Process through the inbox; a replayed duplicate is acked without charging."""
        try:
            outcome = self._inbox.process(payload["id"], payload, self._charge)
        except onceonly.InFlight as exc:
            # A concurrent delivery holds the key: nack, it comes back later.
            raise Retry("in flight") from exc
        except onceonly.StoreUnavailable as exc:
            raise Retry("store unavailable") from exc
        except (onceonly.DeadLettered, onceonly.PayloadMismatch):
            return "dead-lettered"  # ack: a real consumer routes it to a dead-letter queue
        return "skipped" if outcome.replayed else None

    def close(self) -> None:
        """Release the store's connections."""
        self._store.close()


def open_consumer(side: str, target: Target, tables: Tables, consumer: str) -> Consumer:
    """The consumer of ``side`` (``"naive"`` or ``"onceonly"``)."""
    if side == "naive":
        return NaiveConsumer(target, tables)
    return OnceOnlyConsumer(target, tables, consumer)
