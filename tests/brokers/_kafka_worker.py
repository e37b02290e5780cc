# SPDX-License-Identifier: MIT
"""A Kafka consumer process for the kill and poison tests (tests/brokers/test_kafka.py).

Run as ``python -m tests.brokers._kafka_worker '<json config>'``. Mode ``"work"``:
each record's ``id`` goes into the ledger table (then the handler sleeps ``delay``);
SIGTERM stops it gracefully; the records whose ``id`` is in ``block`` hang in their handler
(until the process is killed), those in ``poison`` end the process with ``os._exit(7)``.
Mode ``"crash"``: the handler ends the process with ``os._exit(7)`` on every record
(nothing of the run commits).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

import onceonly
from onceonly.brokers.kafka import KafkaConsumer
from tests.brokers._kits import KAFKA_FAST_JOIN

EXIT_IN_HANDLER = 7


async def main(config: dict[str, Any]) -> None:
    table = config["table"]
    store = onceonly.open_async_store(config["url"], table=table, outbox_table=None)
    inbox = onceonly.AsyncInbox(
        store,
        consumer="kafka-worker",
        precount_attempts=config.get("precount", False),
        max_attempts=config.get("max_attempts", 5),
    )
    delay = float(config.get("delay", 0.0))
    block = set(config.get("block", ()))
    poison = set(config.get("poison", ()))

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        if config["mode"] == "crash" or payload["id"] in poison:
            os._exit(EXIT_IN_HANDLER)
        if payload["id"] in block:
            await asyncio.sleep(3600)
        await tx.execute(f"INSERT INTO {table}_ledger (id) VALUES (?)", (payload["id"],))
        if delay:
            await asyncio.sleep(delay)

    consumer = KafkaConsumer(
        inbox,
        handler,
        topics=[config["topic"]],
        group=config["group"],
        bootstrap=config["bootstrap"],
        config=KAFKA_FAST_JOIN,
        positions_table=f"{table}_pos",
        batch_size=config.get("batch_size", 1),
        batch_wait=0.05,
        concurrency=config.get("concurrency", 16),
        max_deliveries=config.get("max_deliveries"),
        retry_delay=0.05,
        max_backoff=0.2,
    )
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(consumer.stop()))
    try:
        await consumer.run()
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
