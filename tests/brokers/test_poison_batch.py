# SPDX-License-Identifier: MIT
"""A message that kills the worker, inside a batch: only that message is dead-lettered.

The worker is a real subprocess (tests/brokers/_crash_consumer.py) that a supervisor
loop restarts each time the poison message's handler ends it with ``os._exit``; the
brokers are the real RabbitMQ (quorum queue), NATS JetStream and Redis Streams of this
machine. Every message the crash took down is redelivered counted; a redelivered
delivery runs alone, and a restarted consumer takes one delivery at a time while they
come redelivered, so the crash of the poison message counts nothing else.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.brokers._crash_consumer import EXIT_IN_HANDLER, crash_loop
from tests.brokers._kits import AMQP_URL, KITS, NATS_URL, REDIS_URL, Kit

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["rabbitmq", "nats", "redis"])
async def kit(request: pytest.FixtureRequest) -> AsyncIterator[Kit]:
    k = KITS[request.param]()
    await k.start()
    try:
        yield k
    finally:
        await k.cleanup()


def worker_config(kit: Any, tmp_path: Path) -> dict[str, Any]:
    common = {"db": str(tmp_path / "x.db"), "runs": str(tmp_path / "runs")}
    if kit.name == "rabbitmq":
        return {**common, "broker": "rabbitmq", "url": AMQP_URL, "queue": kit.queue}
    if kit.name == "nats":
        return {
            **common,
            "broker": "nats",
            "url": NATS_URL,
            "stream": kit.stream,
            "subject": kit.subject,
            "durable": "contract",
        }
    return {**common, "broker": "redis", "url": REDIS_URL, "stream": kit.stream}


def ledger(path: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return sorted(row[0] for row in conn.execute("SELECT id FROM ledger"))


async def test_worker_killing_message_in_a_batch_is_dead_lettered_alone(
    kit: Kit, tmp_path: Path
) -> None:
    """Batch of 5, the third kills the worker, max_deliveries=2: the 4 others commit
    exactly once, only the poison is dead-lettered (max-deliveries)."""
    db = tmp_path / "x.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("CREATE TABLE ledger (id TEXT NOT NULL)")  # no key: doubles show
        conn.commit()
    for n in range(1, 6):
        await kit.send({"n": n}, message_id=f"m-{n}")
    config = {
        **worker_config(kit, tmp_path),
        "poison": "m-3",
        "batch_size": 5,
        "batch_wait": 1.0,
        "max_deliveries": 2,
    }

    async def done() -> bool:
        # the ledger first: RabbitKit.dead() needs the dead-letter queue declared
        return len(ledger(db)) >= 4 and bool(await kit.dead())

    exits = await crash_loop(config, _none, timeout=40, done=done)
    assert ledger(db) == ["m-1", "m-2", "m-4", "m-5"]
    [(_, headers)] = await kit.dead()
    assert headers["onceonly-message-id"] == "m-3"
    assert headers["onceonly-dead-reason"] == "max-deliveries"
    # the batch's crash, then the poison's own run alone
    assert exits == [EXIT_IN_HANDLER] * 2
    assert await kit.settled()


async def _none() -> int:
    return 0
