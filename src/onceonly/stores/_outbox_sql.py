# SPDX-License-Identifier: MIT
"""What the SQL stores' outbox statements share (no I/O); each backend writes its own
(``stores/<backend>/_outbox_sql.py``, an :class:`~onceonly.types.OutboxStatements`).

Invariants of every outbox table:

* ``seq`` is the insert order; ``id`` (UUIDv7) is the message id, unique.
* Rows are ``pending`` until published (then deleted) or ``dead`` after
  ``max_attempts`` failed publishes (kept for an operator to list and redrive).
* Times are the store's clock, never the application's.
* Ordered mode: only the lowest pending ``seq`` of a key is eligible, so one message per
  key is in flight and a later one waits for the earlier (no global order, no cursor:
  rows that commit late are never skipped). Inserts of one key are serialised by the
  store (a lock per key, or the single writer), so per-key ``seq`` order is commit order.
"""

from __future__ import annotations

from onceonly.errors import ConfigurationError

__all__ = ["COLUMNS", "SCHEMA_VERSION", "eligible", "no_outbox"]

#: The schema version of the outbox table (its row ``outbox:<table>`` in
#: ``onceonly_schema``).
SCHEMA_VERSION = 1
#: The columns a claim reads, in the order ``onceonly.outbox`` reads them.
COLUMNS = "seq, id, topic, key, payload, headers, attempts, created_at"


def eligible(table: str, alias: str, ordered: bool) -> str:
    """The condition (``AND …``, or nothing) that keeps only the oldest pending row of
    each key (ordered mode) among the rows ``alias`` of ``table``."""
    if not ordered:
        return ""
    return (
        f" AND ({alias}.key IS NULL OR NOT EXISTS (SELECT 1 FROM {table} p"
        f" WHERE p.key = {alias}.key AND p.seq < {alias}.seq AND p.state = 'pending'))"
    )


def no_outbox(store: object) -> ConfigurationError:
    """The error of a store without SQL (memory, Redis) asked for an outbox table."""
    return ConfigurationError(
        "the outbox needs a SQL store (SQLite, PostgreSQL, MariaDB/MySQL), "
        f"not {type(store).__name__}"
    )
