# SPDX-License-Identifier: MIT
"""A Kafka consumer's positions in the store (``offsets="store"``, docs/spec.md §4.9).

One row per (group, topic, partition): ``next_offset`` (every record before it is
settled; ``-1``: none stored yet), ``epoch`` (bumped by each member that is assigned
the partition) and ``handed`` (every record a member may have handed to a handler is
below it; ``-1``: none).

* **Claim** (on assignment): bump ``epoch`` and read the row, in one transaction; the
  member seeks to ``next_offset``. A member of an older epoch is a zombie. The records
  from ``next_offset`` up to ``handed`` may have been running when an earlier member
  died: the consumer runs each of them alone, its attempt counted first (Kafka keeps
  no delivery count to say which records come again).
* **Reserve** (before records are handed to handlers): raise ``handed`` past them, in a
  transaction of its own, fenced by the epoch. One write covers the next record free to
  run and a margin of offsets after it (``2 * concurrency``, at least 32); a member that
  stops gracefully lowers it to its position again.
* **Write**: ``next_offset`` moves forward only (``CASE WHEN next_offset < new``) and
  only while ``epoch`` is the writer's: a zombie's write matches no row, and inside a
  handler's transaction it raises :class:`PartitionLost`, which rolls the handler's
  writes back. Positions never move backwards.

The written position is never past a record whose transaction has not committed: a
transaction that settles record ``o`` writes the lowest offset still unsettled other
than ``o`` (:meth:`onceonly._core.offsets.PartitionOrder.watermark`). Writing too low
only means records the inbox replays after a restart.

The table is created by the consumer when missing (``CREATE TABLE IF NOT EXISTS``);
statements use ``?`` placeholders, as ``tx.execute`` does, on PostgreSQL, SQLite and
MySQL/MariaDB (tested on MariaDB: ``tests/brokers/test_kafka_mysql.py``). The table is
created in autocommit: MariaDB/MySQL commit an open transaction at any DDL.
"""

from __future__ import annotations

from typing import Any

from onceonly._core.sql import validate_identifier
from onceonly.errors import OnceOnlyError, StoreUnavailable
from onceonly.types import AsyncStore

__all__ = ["DEFAULT_TABLE", "PartitionLost", "Positions"]

DEFAULT_TABLE = "onceonly_kafka_positions"


class PartitionLost(StoreUnavailable):
    """The partition was assigned to another member (a rebalance) while this record ran:
    its transaction rolls back and the record is left to the new owner.

    Not the handler's failure: like a lost connection (a :class:`StoreUnavailable`),
    nothing of the transaction committed and the inbox counts no attempt; the consumer
    neither retries it nor acks it (the partition's new owner runs the record)."""


class Positions:
    """Reads and writes one consumer group's positions in ``table``."""

    def __init__(self, store: AsyncStore, group: str, table: str = DEFAULT_TABLE) -> None:
        self.store = store
        self.group = group
        self.table = validate_identifier(table)
        self.dialect = store.dialect
        if self.dialect not in ("postgresql", "sqlite", "mysql"):
            raise OnceOnlyError(f"offsets='store' needs a SQL store, not {self.dialect!r}")

    def _ddl(self) -> str:
        return (
            f"CREATE TABLE IF NOT EXISTS {self.table} ("
            "group_name VARCHAR(255) NOT NULL, topic VARCHAR(255) NOT NULL, "
            "part INTEGER NOT NULL, next_offset BIGINT NOT NULL, epoch BIGINT NOT NULL, "
            "writes BIGINT NOT NULL, handed BIGINT NOT NULL, "
            "PRIMARY KEY (group_name, topic, part))"
        )

    async def create(self) -> None:
        """Create the table when missing (in autocommit: MariaDB/MySQL commit any open
        transaction at DDL, which ends the store's transaction under it)."""
        async with self.store.session() as session:
            await session.execute(self._ddl())

    async def claim(self, topic: str, part: int) -> tuple[int | None, int, int]:
        """Take the partition: bump its epoch; return ``(next_offset or None, epoch,
        handed)``."""
        ignore = "INSERT IGNORE INTO" if self.dialect == "mysql" else "INSERT INTO"
        tail = "" if self.dialect == "mysql" else " ON CONFLICT DO NOTHING"
        where = "WHERE group_name = ? AND topic = ? AND part = ?"
        params = (self.group, topic, part)
        async with self.store.transaction(None) as session:
            await session.execute(
                f"{ignore} {self.table} (group_name, topic, part, next_offset, epoch, writes,"
                f" handed) VALUES (?, ?, ?, -1, 0, 0, -1){tail}",
                params,
            )
            await session.execute(
                f"UPDATE {self.table} SET epoch = epoch + 1, writes = writes + 1 {where}",
                params,
            )
            cur = await session.execute(
                f"SELECT next_offset, epoch, handed FROM {self.table} {where}", params
            )
            row = await cur.fetchone()
        assert row is not None
        position, epoch = int(row[0]), int(row[1])
        return (position if position >= 0 else None), epoch, int(row[2])

    def _write_sql(self, handed: bool = False) -> str:
        return (
            f"UPDATE {self.table} SET next_offset = CASE WHEN next_offset < ? THEN ? "
            f"ELSE next_offset END, writes = writes + 1{', handed = ?' if handed else ''} "
            "WHERE group_name = ? AND topic = ? AND part = ? AND epoch = ?"
        )

    async def write_in(self, tx: Any, topic: str, part: int, position: int, epoch: int) -> None:
        """Write ``position`` in the handler's transaction ``tx`` (``tx.execute``).

        Raises:
            PartitionLost: another member took the partition (a newer epoch).
        """
        cur = await tx.execute(
            self._write_sql(), (position, position, self.group, topic, part, epoch)
        )
        if cur.rowcount == 0:
            raise PartitionLost(f"{topic}[{part}] was assigned to another member")

    async def write(
        self, topic: str, part: int, position: int, epoch: int, *, handed: int | None = None
    ) -> bool:
        """Write ``position`` in a transaction of its own (and set ``handed``, when
        given); ``False``: fenced (zombie)."""
        lowered = () if handed is None else (handed,)
        params = (position, position, *lowered, self.group, topic, part, epoch)
        async with self.store.transaction(None) as session:
            cur = await session.execute(self._write_sql(handed is not None), params)
            return bool(cur.rowcount)

    async def reserve(self, topic: str, part: int, handed: int, epoch: int) -> bool:
        """Raise ``handed`` to at least ``handed`` (a transaction of its own), before the
        records below it are handed to handlers; ``False``: fenced (zombie)."""
        async with self.store.transaction(None) as session:
            cur = await session.execute(
                f"UPDATE {self.table} SET handed = CASE WHEN handed < ? THEN ? ELSE handed END,"
                " writes = writes + 1"
                " WHERE group_name = ? AND topic = ? AND part = ? AND epoch = ?",
                (handed, handed, self.group, topic, part, epoch),
            )
            return bool(cur.rowcount)

    async def read(self, topic: str, part: int) -> int | None:
        """The stored position (``None``: none)."""
        async with self.store.transaction(None) as session:
            cur = await session.execute(
                f"SELECT next_offset FROM {self.table} "
                "WHERE group_name = ? AND topic = ? AND part = ?",
                (self.group, topic, part),
            )
            row = await cur.fetchone()
        return None if row is None or int(row[0]) < 0 else int(row[0])
