# SPDX-License-Identifier: MIT
"""A consumer process whose handler kills it: the poison message of the broker tests.

Run as ``python -m tests.brokers._crash_consumer '<json config>'``. The handler appends
the delivery count to ``config["runs"]`` and then ends the process with ``os._exit(7)``
(no cleanup, no rollback: in atomic mode nothing of the run commits, so the inbox's
attempts never move). With ``config["poison"]`` (a message id) only that message kills
the worker; the others write their ledger row and return. ``batch_size`` and
``batch_wait`` pass through. :func:`crash_loop` restarts it the way a supervisor would.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import onceonly

ROOT = Path(__file__).resolve().parents[2]
EXIT_IN_HANDLER = 7


def make_consumer(config: dict[str, Any], inbox: onceonly.AsyncInbox, handler: Any) -> Any:
    broker = config["broker"]
    limit: dict[str, Any] = {}
    for option in ("max_deliveries", "batch_size", "batch_wait"):
        if config.get(option) is not None:
            limit[option] = config[option]
    if broker == "rabbitmq":
        from onceonly.brokers.rabbitmq import RabbitMQConsumer

        return RabbitMQConsumer(inbox, handler, queue=config["queue"], url=config["url"], **limit)
    if broker == "nats":
        from onceonly.brokers.nats import NatsConsumer

        return NatsConsumer(
            inbox,
            handler,
            url=config["url"],
            stream=config["stream"],
            subject=config["subject"],
            durable=config["durable"],
            ack_wait=1.0,
            poll_timeout=0.25,
            **limit,
        )
    if broker == "redis":
        from onceonly.brokers.redis_streams import RedisStreamsConsumer

        return RedisStreamsConsumer(
            inbox,
            handler,
            url=config["url"],
            stream=config["stream"],
            group="g",
            consumer_name="crashing",
            claim_idle=1.0,
            block_ms=100,
            **limit,
        )
    raise ValueError(broker)


async def main(config: dict[str, Any]) -> None:
    store = onceonly.open_async_store(f"sqlite:///{config['db']}")
    await store.migrate()
    inbox = onceonly.AsyncInbox(store, consumer="crash")

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        await tx.execute("INSERT INTO ledger (id) VALUES (?)", (tx.key,))
        if config.get("poison") not in (None, tx.key):
            return
        count = tx.delivery.delivery_count if tx.delivery else None
        with open(config["runs"], "a", encoding="utf-8") as f:
            f.write(f"{count}\n")
        os._exit(EXIT_IN_HANDLER)  # the worker dies inside the handler

    await make_consumer(config, inbox, handler).run()


def runs(path: Path) -> list[int | None]:
    """The delivery counts the handler saw, one per run (and per crash)."""
    if not path.exists():
        return []
    return [None if x == "None" else int(x) for x in path.read_text().split()]


async def crash_loop(
    config: dict[str, Any],
    dead_letters: Callable[[], Awaitable[int]],
    timeout: float = 40.0,
    *,
    done: Callable[[], Awaitable[bool]] | None = None,
) -> list[int]:
    """Start the worker, and again each time it dies, until a dead letter appears (or
    until ``done()`` says so).

    Returns the exit codes of the workers that died (each one in its handler).
    """
    deadline = time.monotonic() + timeout
    exits: list[int] = []
    proc: subprocess.Popen[bytes] | None = None

    async def finished() -> bool:
        return await done() if done is not None else bool(await dead_letters())

    try:
        while not await finished():
            if time.monotonic() > deadline:
                raise AssertionError(f"no dead letter after {len(exits)} crashes")
            if proc is not None and proc.poll() is not None:
                exits.append(proc.returncode)
                proc = None
            if proc is None:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "tests.brokers._crash_consumer", json.dumps(config)],
                    cwd=ROOT,
                )
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # let the worker ack what it dead-lettered
    finally:
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return exits


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
