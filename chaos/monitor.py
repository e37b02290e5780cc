# SPDX-License-Identifier: MIT
"""Progress samples of a running pipeline, taken by the harness (not a worker).

A :class:`Sample` counts orders, effects, pending outbox rows, unfinished records and
the messages ready in the queue. The harness's connections reconnect after the faults
(its PostgreSQL connection is never terminated by the injector, but a restart of the
cluster breaks it); a sample that cannot be taken is ``None``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import aio_pika
import psycopg
from aio_pika.abc import AbstractChannel, AbstractConnection

from chaos.spec import ECHO_OUTBOX, EFFECTS, ORDERS, OUTBOX, RECORDS

__all__ = ["Monitor", "Sample"]

HARNESS = "chaos-harness"


@dataclass(frozen=True)
class Sample:
    """One look at the pipeline."""

    orders: int
    effects: int
    effected: int  # distinct message ids with an effect
    outbox: int  # pending rows, both outboxes
    unfinished: int  # records in_progress or failed
    ready: int  # messages ready in the queue (unacknowledged ones are not counted;
    # Kafka: orders without their effect, see chaos.kafka)


class Monitor:
    """Takes :class:`Sample` s through the harness's own connections."""

    def __init__(self, pg_url: str, amqp_url: str, queue: str, broker: str = "rabbitmq") -> None:
        self.pg_url = pg_url
        self.broker = broker
        self.amqp_url = amqp_url
        self.queue = queue
        self._pg: psycopg.AsyncConnection[tuple[int, ...]] | None = None
        self._amqp: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None

    async def sample(self) -> Sample | None:
        db = await self._db_counts()
        if self.broker == "kafka":
            # Tansu's high watermark counts record batches, not records: what is not
            # consumed yet is every order without its effect (chaos.kafka)
            return None if db is None else Sample(*db, ready=max(0, db[0] - db[2]))
        ready = await self._ready()
        if db is None or ready is None:
            return None
        return Sample(*db, ready=ready)

    async def _db_counts(self) -> tuple[int, int, int, int, int] | None:
        try:
            if self._pg is None or self._pg.closed:
                self._pg = await psycopg.AsyncConnection.connect(
                    self.pg_url, autocommit=True, connect_timeout=3
                )
            cur = await self._pg.execute(
                f"SELECT (SELECT count(*) FROM {ORDERS}),"
                f" (SELECT count(*) FROM {EFFECTS}),"
                f" (SELECT count(DISTINCT message_id) FROM {EFFECTS}),"
                f" (SELECT count(*) FROM {OUTBOX} WHERE state = 'pending')"
                f" + (SELECT count(*) FROM {ECHO_OUTBOX} WHERE state = 'pending'),"
                f" (SELECT count(*) FROM {RECORDS} WHERE state IN ('in_progress', 'failed'))"
            )
            row = await cur.fetchone()
        except psycopg.Error:
            await self._close_pg()
            return None
        assert row is not None
        return (int(row[0]), int(row[1]), int(row[2]), int(row[3]), int(row[4]))

    async def _ready(self) -> int | None:
        try:
            if self._amqp is None or self._amqp.is_closed:
                self._amqp = await aio_pika.connect(self.amqp_url)
                self._channel = None
            if self._channel is None or self._channel.is_closed:
                self._channel = await self._amqp.channel()
            queue = await self._channel.declare_queue(self.queue, passive=True)
            return int(queue.declaration_result.message_count or 0)
        except Exception:
            await self._close_amqp()
            return None

    async def _close_pg(self) -> None:
        pg, self._pg = self._pg, None
        if pg is not None:
            with contextlib.suppress(Exception):
                await pg.close()

    async def _close_amqp(self) -> None:
        amqp, self._amqp, self._channel = self._amqp, None, None
        if amqp is not None:
            with contextlib.suppress(Exception):
                await amqp.close()

    async def close(self) -> None:
        await self._close_pg()
        await self._close_amqp()
