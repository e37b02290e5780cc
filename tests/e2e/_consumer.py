# SPDX-License-Identifier: MIT
"""Service B: ``python -m tests.e2e._consumer --prefix P --broker B ...``.

The broker's consumer with an ``AsyncInbox`` on PostgreSQL; the handler inserts the
event id into ``<prefix>_ledger`` (no unique constraint: only the inbox stands between a
duplicate delivery and a duplicate row) through ``tx.execute``, in the inbox's
transaction. It counts what ``inbox.process`` returned (``processed``: the handler ran
and committed; ``replayed``: a duplicate answered from the stored outcome) and writes
the counts to ``--status`` every 0.1 s and on exit. SIGTERM stops it gracefully.

``--kill-on-ack K``: SIGKILL itself when the client is about to send the K-th
acknowledgement, that is after the inbox committed and before the broker hears the ack,
so the broker delivers that message again.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections import Counter
from typing import Any

import onceonly
from tests.e2e._common import BROKERS, PG_URL, Names, die, make_consumer, patch_acks, write_json


async def main(args: argparse.Namespace) -> int:
    names = Names(args.prefix)
    counts: Counter[str] = Counter()
    store = onceonly.open_async_store(
        args.pg, table=names.records, outbox_table=names.outbox, max_size=4
    )
    inbox = onceonly.AsyncInbox(store, consumer="ledger", wait=10.0)
    process = inbox.process

    async def counting_process(*a: Any, **kw: Any) -> Any:
        try:
            outcome = await process(*a, **kw)
        except Exception as exc:
            counts[f"error:{type(exc).__name__}"] += 1
            raise
        counts["replayed" if outcome.replayed else "processed"] += 1
        return outcome

    inbox.process = counting_process  # type: ignore[method-assign]

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> dict[str, Any]:
        await tx.execute(
            f"INSERT INTO {names.ledger} (event_id) VALUES (?)", (payload["event_id"],)
        )
        return {"event_id": payload["event_id"]}

    def on_ack(n: int) -> None:
        counts["acks"] += n
        if args.kill_on_ack and counts["acks"] >= args.kill_on_ack:
            die()

    patch_acks(args.broker, on_ack)
    consumer = make_consumer(args.broker, inbox, handler, args.broker_url, names, args.member)

    def report(state: str) -> None:
        write_json(args.status, {"pid": os.getpid(), "state": state, **counts})

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        async with consumer:
            report("ready")
            # the consumer's own task ends early only if it failed: exit then, loudly
            running = getattr(consumer, "_task", None)
            waits: set[asyncio.Future[Any]] = {asyncio.ensure_future(stop.wait())}
            if running is not None:
                waits.add(running)
            while not stop.is_set():
                done, _ = await asyncio.wait(waits, timeout=0.1)
                report("ready")
                if running is not None and running in done:
                    running.result()  # raises what ended it
                    raise RuntimeError("the consumer stopped on its own")
            for w in waits:
                if w is not running:
                    w.cancel()
    finally:
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
    parser.add_argument("--member", default=f"e2e-{os.getpid()}", help="Redis consumer name")
    parser.add_argument("--kill-on-ack", type=int, default=0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s consumer %(name)s %(levelname)s %(message)s"
    )
    sys.exit(asyncio.run(main(parse(sys.argv[1:]))))
