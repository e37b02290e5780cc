# SPDX-License-Identifier: MIT
"""The worker process: lease, handle, ack — until the queue is empty.

A worker acks a delivery only after its consumer returned, so a worker killed at any
instant leaves its message to be redelivered when the visibility timeout runs out.
A consumer error is not fatal: the delivery is left unacknowledged (and counted), as a
broker client would nack it.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass

from onceonly.demo._broker import Broker
from onceonly.demo._consumers import Retry, open_consumer
from onceonly.demo._database import Tables, Target

__all__ = ["WorkerSpec", "worker_main"]

IDLE_SLEEP = 0.01


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs (picklable).

    Attributes:
        side: ``"naive"`` or ``"onceonly"``.
        broker_path: the queue file of this side.
        visibility_timeout: seconds before an unacked delivery is redelivered.
        target: the database under test.
        tables: the business tables.
        consumer: onceonly's consumer name (unique per run).
    """

    side: str
    broker_path: str
    visibility_timeout: float
    target: Target
    tables: Tables
    consumer: str


def worker_main(spec: WorkerSpec) -> None:
    """Consume until the queue holds no message (acked or leased elsewhere)."""
    # Ctrl-C is the supervisor's business: it kills the workers and cleans up.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    broker = Broker(spec.broker_path, spec.visibility_timeout)
    consumer = open_consumer(spec.side, spec.target, spec.tables, spec.consumer)
    try:
        while True:
            lease = broker.lease()
            if lease is None:
                if broker.remaining() == 0:
                    return
                time.sleep(IDLE_SLEEP)
                continue
            try:
                counter = consumer.handle(lease.payload)
            except Retry as retry:
                broker.bump(retry.counter)
                continue
            except Exception as exc:  # a failed delivery: nack it, as a broker client would
                broker.bump(f"error: {type(exc).__name__}")
                continue
            if counter is not None:
                broker.bump(counter)
            broker.ack(lease)
    finally:
        consumer.close()
        broker.close()
