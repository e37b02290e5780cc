# SPDX-License-Identifier: MIT
"""How long a Kafka consumer that restarts after a SIGKILL takes to finish a partition.

After an assignment the records between the stored position and the partition's handed
mark may have been running on the member that died, so each runs alone, its attempt
counted first (docs/brokers.md, Kafka, "Poison records"). This measures what that costs:
one partition holding ``--messages`` keyed records, a worker process
(``tests/brokers/_kafka_worker.py``: each record inserts a ledger row, then sleeps
``--delay``) SIGKILLed once ``--kill-after`` records committed, then a new worker. It
prints the stored position and the handed mark the new worker found, and the seconds it
took from its first commit to the last (the group join, seconds on Tansu, left out).

    PYTHONPATH=src .venv/bin/python bench/kafka_restart.py [--messages 300]
        [--delay 0.02] [--concurrency 8] [--kill-after 30] [--repeat 2]

Needs PostgreSQL and Tansu (``scripts/services kafka``). A benchmark, not a test: it
prints numbers and exits 0 unless it fails.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.brokers.test_kafka import Env, _count, eventually


async def once(messages: int, delay: float, concurrency: int, kill_after: int) -> str:
    env = Env(partitions=1)
    await env.start()
    try:
        await env.send([(f"k{i % 50}", {"id": f"r{i}"}) for i in range(messages)])
        proc = env.worker(delay=delay, concurrency=concurrency)
        await eventually(lambda: _count(env, kill_after), timeout=60)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        before = len(await env.ledger())
        async with env.store.transaction() as tx:
            cur = await tx.execute(f"SELECT next_offset, handed FROM {env.table}_pos")
            row = await cur.fetchone()
        proc = env.worker(delay=delay, concurrency=concurrency)
        try:
            await eventually(lambda: _count(env, before + 1), timeout=60)
            first = time.monotonic()
            await eventually(lambda: _count(env, messages), timeout=300)
            took = time.monotonic() - first
        finally:
            proc.terminate()
            proc.wait(20)
        rows = await env.ledger()
        assert len(rows) == len(set(rows)) == messages, "a record lost or doubled"
        return (
            f"killed after {before} commits; position {row[0]}, handed mark {row[1]}"
            f" ({row[1] - row[0]} records to run alone); the other {messages - before}"
            f" in {took:.2f} s"
        )
    finally:
        await env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--delay", type=float, default=0.02)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--kill-after", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    for _ in range(args.repeat):
        line = asyncio.run(once(args.messages, args.delay, args.concurrency, args.kill_after))
        print(line, flush=True)


if __name__ == "__main__":
    main()
