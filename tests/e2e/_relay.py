# SPDX-License-Identifier: MIT
"""An outbox relay process: ``python -m tests.e2e._relay --prefix P --broker B ...``.

Runs ``AsyncRelay`` on the PostgreSQL outbox ``<prefix>_outbox`` with the broker's
publisher until SIGTERM, then stops gracefully (the batch in hand is finished). Every
0.1 s and on exit it writes its stats to ``--status`` as JSON.

``--kill-after K``: SIGKILL itself right after the K-th publish the broker confirmed,
that is after the confirmation and before the relay deletes the batch's rows, so a
relay started later publishes those rows again.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import Any

import onceonly
from onceonly.messaging import OutboxMessage
from tests.e2e._common import BROKERS, PG_URL, Names, die, make_publisher, write_json


class KillAfterConfirms:
    """A publisher that dies after ``limit`` confirmed publishes."""

    def __init__(self, inner: Any, limit: int) -> None:
        self.inner = inner
        self.limit = limit
        self.confirmed = 0

    async def publish(self, message: OutboxMessage) -> None:
        await self.inner.publish(message)  # returns once the broker confirmed it
        self.confirmed += 1
        if self.confirmed >= self.limit:
            die()

    async def close(self) -> None:
        await self.inner.close()


async def main(args: argparse.Namespace) -> int:
    names = Names(args.prefix)
    store = onceonly.open_async_store(
        args.pg, table=names.records, outbox_table=names.outbox, max_size=2
    )
    publisher = make_publisher(args.broker, args.broker_url)
    if args.kill_after:
        publisher = KillAfterConfirms(publisher, args.kill_after)
    relay = onceonly.AsyncRelay(
        store,
        publisher,
        batch_size=args.batch_size,
        poll_interval=0.5,
        max_attempts=1000,  # nothing goes dead while a connection is down
        backoff_base=0.05,
        backoff_cap=0.5,
    )
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, relay.stop)

    def report(state: str) -> None:
        s = relay.stats
        write_json(
            args.status,
            {
                "pid": os.getpid(),
                "state": state,
                "published": s.published,
                "failed": s.failed,
                "dead": s.dead,
                "batches": s.batches,
            },
        )

    async def reporter() -> None:
        while True:
            report("running")
            await asyncio.sleep(0.1)

    task = asyncio.ensure_future(reporter())
    try:
        await relay.run()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await publisher.close()
        await store.close()
    report("stopped")
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--broker", required=True, choices=BROKERS)
    parser.add_argument("--broker-url", required=True)
    parser.add_argument("--pg", default=PG_URL)
    parser.add_argument("--status", required=True)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--kill-after", type=int, default=0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s relay %(name)s %(levelname)s %(message)s"
    )
    sys.exit(asyncio.run(main(parse(sys.argv[1:]))))
