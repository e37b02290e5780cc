# SPDX-License-Identifier: MIT
"""The Kafka side of a chaos run (``--broker kafka``): the broker is Tansu, a
Kafka-compatible broker (not Apache Kafka; ``scripts/services kafka``).

* The consumers are :class:`onceonly.brokers.kafka.KafkaConsumer` s of one group (the
  run's topic name), with their positions in :data:`POSITIONS` on the run's private
  cluster, written in the handler's transaction (``offsets="store"``).
* What is left "in the queue" after the consumers stopped is every record of the topic
  at or past its partition's stored position (:func:`read_topic`); the dead letters are
  every record of ``<topic>.dead``.
* The topic has :data:`PARTITIONS` partitions. Rebalances: each assignment of a
  partition to a member bumps its epoch in :data:`POSITIONS` (:func:`assignments`), so
  their sum counts the assignments (a rebalance reassigns every partition).
* The monitor's "ready" is the number of orders without their effect (Tansu's high
  watermark counts record batches, not records, so the topic's lag cannot be read):
  the drain waits for every order's effect, or for the pipeline to stall.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import psycopg

from chaos.checker import MAX_QUEUE_READ, QueueContents

__all__ = [
    "FAST_JOIN",
    "PARTITIONS",
    "POSITIONS",
    "assignments",
    "create_topic",
    "read_topic",
    "stored_positions",
]

POSITIONS = "chaos_kafka_positions"
#: partitions of the run's topic: enough for every consumer to own some
PARTITIONS = 8
#: empty polls (0.5 s each) that end a read: Tansu's end-of-partition follows its high
#: watermark, which counts record batches, so the read does not rely on it alone
IDLE_POLLS = 6
#: group joins in seconds instead of ~23 s with the client's defaults (Tansu)
FAST_JOIN: dict[str, Any] = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}


async def create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    """Create the run's topic with ``partitions`` partitions (before the relays publish)."""
    from onceonly.brokers.kafka._wire import ensure_topics

    config = {"bootstrap.servers": bootstrap}
    await asyncio.get_running_loop().run_in_executor(
        None, ensure_topics, config, [(topic, partitions)]
    )


def stored_positions(pg_url: str, group: str) -> dict[int, int]:
    """The group's stored position per partition (``{}`` before the first assignment)."""
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            rows = conn.execute(
                f"SELECT part, next_offset FROM {POSITIONS} WHERE group_name = %s", (group,)
            ).fetchall()
    except psycopg.errors.UndefinedTable:
        return {}
    return {int(p): int(o) for p, o in rows}


def assignments(pg_url: str, group: str) -> int:
    """How many times a partition was assigned to a member (the first ones included)."""
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            row = conn.execute(
                f"SELECT coalesce(sum(epoch), 0) FROM {POSITIONS} WHERE group_name = %s",
                (group,),
            ).fetchone()
    except psycopg.Error:
        return 0
    return int(row[0]) if row else 0


async def read_topic(
    bootstrap: str, topic: str, starts: dict[int, int] | None = None
) -> QueueContents:
    """The ids (``onceonly-message-id``) of ``topic``'s records from ``starts`` (partition
    -> offset; missing or negative: the beginning) to the end."""
    return await asyncio.get_running_loop().run_in_executor(
        None, _read_topic, bootstrap, topic, starts or {}
    )


def _read_topic(bootstrap: str, topic: str, starts: dict[int, int]) -> QueueContents:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

    found = QueueContents()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "chaos-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=10)
        parts = sorted(meta.topics[topic].partitions) if topic in meta.topics else []
        if not parts:
            return found
        consumer.assign(
            [
                TopicPartition(topic, p, s if (s := starts.get(p, -1)) >= 0 else OFFSET_BEGINNING)
                for p in parts
            ]
        )
        ended: set[int] = set()
        idle = 0
        while len(ended) < len(parts) and idle < IDLE_POLLS and found.count < MAX_QUEUE_READ:
            batch = consumer.consume(500, 0.5)
            if not batch:
                idle += 1
                continue
            idle = 0
            for m in batch:
                err = m.error()
                if err is not None:
                    if err.code() == err._PARTITION_EOF:
                        ended.add(m.partition() or 0)
                    continue
                found.count += 1
                headers = dict(m.headers() or [])
                value = headers.get("onceonly-message-id")
                found.ids.append(value.decode() if isinstance(value, bytes) else "<no id>")
    except KafkaException as exc:
        found.error = f"{type(exc).__name__}: {exc}"
    finally:
        with contextlib.suppress(Exception):
            consumer.close()
    return found
