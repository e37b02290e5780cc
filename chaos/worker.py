# SPDX-License-Identifier: MIT
"""The pipeline's processes: ``python -m chaos.worker ROLE --spec F --slot N --status F``.

* ``producer``: places its share of the order requests (``request_no % producers ==
  slot``) through the ``orders`` inbox; see :mod:`chaos.spec`. A restarted producer
  reads which of its requests already have an order, sends the most recent few again
  (an upstream client's retries: the inbox must replay them, not place them twice) and
  places the rest. A request that fails for a transient reason is retried with capped
  backoff (bounded); a dead one is left to the checker. Exits 0 when its share is done.
* ``relay``: an :class:`~onceonly.AsyncRelay` for each outbox (main and echo), each
  with its own :class:`~onceonly.brokers.rabbitmq.RabbitMQPublisher` (``--broker kafka``:
  :class:`~onceonly.brokers.kafka.KafkaPublisher`), until SIGTERM.
  A relay whose ``run()`` raises ends the process (exit 1), as ``onceonly relay`` would:
  the supervisor restarts it and counts it.
* ``consumer``: a :class:`~onceonly.brokers.rabbitmq.RabbitMQConsumer` (or a
  :class:`~onceonly.brokers.kafka.KafkaConsumer` of the run's group, its positions in
  the handler's transaction: :mod:`chaos.kafka`) with an
  :class:`~onceonly.AsyncInbox` (scope ``effects``) whose handler inserts the message's
  ``effects`` row, until SIGTERM (graceful: running handlers finish and settle).

Each process rewrites its JSON status file every 0.2 s and on exit: its counters, and
on a failure the error that ended it. A process whose supervisor is gone exits.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import onceonly
from chaos.spec import ECHO_OUTBOX, EFFECTS, ORDERS, OUTBOX, RECORDS, ROLES, Spec, order_payload
from onceonly.brokers.rabbitmq import RabbitMQConsumer, RabbitMQPublisher
from onceonly.inbox import Outcome
from onceonly.messaging import Delivery
from onceonly.types import AsyncStore

T = TypeVar("T")

STATUS_EVERY = 0.2
REPLAY_WINDOW = 8  # recent requests a restarted producer sends again
REQUEST_TRIES = 600  # transient failures of one request before the producer gives up
BACKOFF_CAP = 1.0


class Status:
    """The process's counters, written as JSON to ``path`` (atomically)."""

    def __init__(self, path: Path, role: str, slot: int) -> None:
        self.path = path
        self.counts: Counter[str] = Counter()
        self.fields: dict[str, Any] = {"pid": os.getpid(), "role": role, "slot": slot}
        self.state = "starting"

    def write(self) -> None:
        data = {**self.fields, "state": self.state, "counts": dict(self.counts)}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, self.path)

    async def keep_writing(self) -> None:
        while True:
            self.write()
            await asyncio.sleep(STATUS_EVERY)


class CountingInbox(onceonly.AsyncInbox):
    """An inbox that counts what each ``process`` call ended with."""

    counts: Counter[str]

    async def process(
        self,
        key: str,
        payload: Any,
        handler: Callable[[Any, onceonly.AsyncTx], Awaitable[T]],
        *,
        connection: Any = None,
        delivery: Delivery | None = None,
    ) -> Outcome[T]:
        try:
            outcome = await super().process(
                key, payload, handler, connection=connection, delivery=delivery
            )
        except onceonly.InFlight:
            self.counts["in-flight"] += 1
            raise
        except onceonly.DeadLettered:
            self.counts["dead-lettered"] += 1
            raise
        except onceonly.PayloadMismatch:
            self.counts["payload-mismatch"] += 1
            raise
        except onceonly.StoreError as exc:
            self.counts[f"store-error:{type(exc).__name__}"] += 1
            raise
        except Exception as exc:
            self.counts[f"handler-error:{type(exc).__name__}"] += 1
            raise
        self.counts["replayed" if outcome.replayed else "processed"] += 1
        return outcome


# -- producer -----------------------------------------------------------------------------


async def _committed(store: AsyncStore, name: str, deadline: float) -> list[int]:
    """The request numbers this producer already placed (retried while the store is down)."""
    delay = 0.05
    while True:
        try:
            async with store.session() as session:
                cur = await session.execute(
                    f"SELECT request_no FROM {ORDERS} WHERE producer = ? ORDER BY at", (name,)
                )
                return [int(r[0]) for r in await cur.fetchall()]
        except onceonly.StoreError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(BACKOFF_CAP, delay * 2)


async def run_producer(spec: Spec, slot: int, status: Status) -> int:
    name = f"producer-{slot}"
    store = onceonly.open_async_store(
        spec.pg_url(f"chaos-{name}"),
        table=RECORDS,
        outbox_table=OUTBOX,
        max_size=spec.producer_concurrency,
        timeout=10.0,
    )
    inbox = CountingInbox(store, consumer="orders", wait=10.0)
    inbox.counts = status.counts
    echo = onceonly.AsyncOutbox(store, table=ECHO_OUTBOX)

    async def place(request: dict[str, Any], tx: onceonly.AsyncTx) -> dict[str, Any]:
        n = int(request["request"])
        duplicated = spec.duplicated(n)
        payload = {"order": n, "customer": request["customer"], "amount": request["amount"]}
        message_id = await tx.publish(spec.queue, payload)
        await tx.execute(
            f"INSERT INTO {ORDERS} (request_no, message_id, duplicated, producer)"
            " VALUES (?, ?, ?, ?)",
            (n, message_id, duplicated, name),
        )
        if duplicated:  # the same message, same id, through the echo outbox
            copy = dataclasses.replace(echo.prepare(spec.queue, payload), id=message_id)
            async with store.transaction(tx.connection) as session:
                await echo.write(session, copy)
        return {"message_id": message_id}

    try:
        committed = await _committed(store, name, time.monotonic() + 60)
        done = set(committed)
        resend = committed[-REPLAY_WINDOW:]
        todo: deque[int] = deque(resend)
        todo.extend(n for n in range(slot, spec.messages, spec.producers) if n not in done)
        status.fields.update(resumed_with=len(done), resent=len(resend), todo=len(todo))
        status.state = "running"

        async def one(n: int) -> None:
            delay = 0.05
            for _ in range(REQUEST_TRIES):
                try:
                    await inbox.process(f"order-{n}", order_payload(spec, n), place)
                    return
                except onceonly.DeadLettered:
                    return  # the checker reports the request
                except Exception:  # counted by the inbox; transient: retry
                    await asyncio.sleep(delay)
                    delay = min(BACKOFF_CAP, delay * 2)
            raise RuntimeError(f"order-{n} failed {REQUEST_TRIES} times")

        async def lane() -> None:
            while todo:
                await one(todo.popleft())

        await asyncio.gather(*(lane() for _ in range(spec.producer_concurrency)))
        status.state = "done"
        return 0
    finally:
        await store.close()


# -- relay --------------------------------------------------------------------------------


async def run_relay(spec: Spec, slot: int, status: Status) -> int:
    store = onceonly.open_async_store(
        spec.pg_url(f"chaos-relay-{slot}"),
        table=RECORDS,
        outbox_table=OUTBOX,
        max_size=4,
        timeout=10.0,
    )
    publishers = [_publisher(spec) for _ in range(2)]
    relays = {
        table: onceonly.AsyncRelay(
            store,
            publisher,
            table=table,
            batch_size=spec.relay_batch,
            poll_interval=0.5,
            max_attempts=1000,  # nothing goes dead while the database or broker is down
            backoff_base=0.05,
            backoff_cap=0.5,
        )
        for table, publisher in zip((OUTBOX, ECHO_OUTBOX), publishers, strict=True)
    }

    def stop() -> None:
        for relay in relays.values():
            relay.stop()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop)

    async def stats() -> None:
        while True:
            for table, relay in relays.items():
                for field in ("published", "failed", "dead", "batches"):
                    status.counts[f"{table}:{field}"] = getattr(relay.stats, field)
            await asyncio.sleep(STATUS_EVERY / 2)

    counter = asyncio.ensure_future(stats())
    status.state = "running"
    try:
        runs = [asyncio.ensure_future(r.run()) for r in relays.values()]
        done, pending = await asyncio.wait(runs, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()  # raises what ended a relay
        await asyncio.gather(*pending)
        return 0
    finally:
        counter.cancel()
        for table, relay in relays.items():
            for field in ("published", "failed", "dead", "batches"):
                status.counts[f"{table}:{field}"] = getattr(relay.stats, field)
        for publisher in publishers:
            await publisher.close()
        await store.close()


# -- consumer -----------------------------------------------------------------------------


async def run_consumer(spec: Spec, slot: int, status: Status) -> int:
    name = f"consumer-{slot}"
    store = onceonly.open_async_store(
        spec.pg_url(f"chaos-{name}"),
        table=RECORDS,
        outbox_table=None,
        max_size=spec.concurrency,
        timeout=10.0,
    )
    inbox = CountingInbox(store, consumer="effects", wait=5.0)
    inbox.counts = status.counts

    async def handler(payload: dict[str, Any], tx: onceonly.AsyncTx) -> None:
        delivery = tx.delivery
        await tx.execute(
            f"INSERT INTO {EFFECTS} (message_id, request_no, consumer, attempt,"
            " delivery_count, redelivered) VALUES (?, ?, ?, ?, ?, ?)",
            (
                tx.key,
                int(payload["order"]),
                name,
                tx.attempt,
                delivery.delivery_count if delivery else None,
                bool(delivery and delivery.redelivered),
            ),
        )

    consumer = _consumer(spec, inbox, handler)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        async with consumer:
            status.state = "running"
            # the consumer's task ends early only if it failed: exit then, loudly
            running: asyncio.Task[None] | None = getattr(consumer, "_task", None)
            stopping = asyncio.ensure_future(stop.wait())
            waits: set[asyncio.Future[Any]] = {stopping}
            if running is not None:
                waits.add(running)
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if running is not None and running.done():
                running.result()
                raise RuntimeError("the consumer stopped on its own")
        return 0
    finally:
        await store.close()


def _publisher(spec: Spec) -> Any:
    if spec.broker == "kafka":
        from onceonly.brokers.kafka import KafkaPublisher

        return KafkaPublisher(spec.kafka_bootstrap, timeout=5.0)
    return RabbitMQPublisher(spec.amqp_url, timeout=5.0)


def _consumer(spec: Spec, inbox: onceonly.AsyncInbox, handler: Any) -> Any:
    if spec.broker == "kafka":
        from chaos.kafka import FAST_JOIN, POSITIONS
        from onceonly.brokers.kafka import KafkaConsumer

        return KafkaConsumer(
            inbox,
            handler,
            topics=[spec.queue],
            group=spec.queue,
            bootstrap=spec.kafka_bootstrap,
            config=FAST_JOIN,
            positions_table=POSITIONS,
            concurrency=spec.concurrency,
            retry_delay=0.2,
            max_backoff=1.0,
            shutdown_timeout=10.0,
        )
    sep = "&" if "?" in spec.amqp_url else "?"
    return RabbitMQConsumer(
        inbox,
        handler,
        queue=spec.queue,
        url=f"{spec.amqp_url}{sep}reconnect_interval=0.5",
        concurrency=spec.concurrency,
        shutdown_timeout=10.0,
    )


# -- entry point --------------------------------------------------------------------------


async def _exit_when_orphaned(parent: int) -> None:
    """Exit once the supervisor is gone (even SIGKILLed): nobody would stop us then."""
    while True:
        if os.getppid() != parent:
            os._exit(70)
        await asyncio.sleep(0.5)


MAINS: dict[str, Callable[[Spec, int, Status], Awaitable[int]]] = {
    "producer": run_producer,
    "relay": run_relay,
    "consumer": run_consumer,
}


async def main(args: argparse.Namespace) -> int:
    spec = Spec.load(Path(args.spec))
    status = Status(Path(args.status), args.role, args.slot)
    writer = asyncio.ensure_future(status.keep_writing())
    guard = asyncio.ensure_future(_exit_when_orphaned(args.parent))
    try:
        code = await MAINS[args.role](spec, args.slot, status)
        if status.state != "done":
            status.state = "stopped"
        return code
    except BaseException as exc:
        status.state = "failed"
        status.fields["error"] = f"{type(exc).__name__}: {exc}"[:500]
        raise
    finally:
        writer.cancel()
        guard.cancel()
        status.write()


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--slot", type=int, required=True)
    parser.add_argument("--status", required=True)
    parser.add_argument("--parent", type=int, default=os.getppid(), help="the supervisor's pid")
    return parser.parse_args(argv)


if __name__ == "__main__":
    # Ctrl-C is the supervisor's business: it stops the workers and cleans up.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    arguments = parse(sys.argv[1:])
    logging.basicConfig(
        level=logging.WARNING,
        format=f"%(asctime)s {arguments.role}-{arguments.slot} %(name)s %(levelname)s %(message)s",
    )
    sys.exit(asyncio.run(main(arguments)))
