# SPDX-License-Identifier: MIT
"""What every process of a chaos run shares: the run's :class:`Spec` and its names.

The pipeline, all on the run's private PostgreSQL cluster and one RabbitMQ queue:

* **producers** (service A) take order requests ``0 .. messages-1`` through an atomic
  :class:`onceonly.AsyncInbox` (scope ``orders``): one transaction claims the request,
  inserts its ``orders`` row and writes the order's message to the outbox
  (``tx.publish``). For about ``duplicates`` of the orders the same transaction also
  writes the same message (same id, same payload) to a second outbox, ``outbox_echo``:
  the copy reaches the broker as a duplicate with the same message id, as a producer's
  retried send would;
* **relays** run two :class:`onceonly.AsyncRelay` each (``outbox`` and ``outbox_echo``)
  publishing to the queue;
* **consumers** (service B) run :class:`onceonly.brokers.rabbitmq.RabbitMQConsumer`
  with an atomic inbox (scope ``effects``) whose handler inserts one row per message
  into ``effects``, which has no unique constraint: a double effect is a visible row.

Every database connection names its process (``application_name`` ``chaos-<role>-<slot>``)
so the fault injector can terminate the workers' backends and nothing else.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ECHO_OUTBOX",
    "EFFECTS",
    "ORDERS",
    "OUTBOX",
    "RECORDS",
    "ROLES",
    "SCHEMA",
    "Spec",
    "order_payload",
]

RECORDS = "onceonly_records"
OUTBOX = "outbox"
ECHO_OUTBOX = "outbox_echo"
ORDERS = "orders"
EFFECTS = "effects"
ROLES = ("producer", "relay", "consumer")

#: The business tables. Neither has a unique constraint on what should be unique
#: (``orders.request_no``, ``effects.message_id``): only onceonly stands between a
#: duplicate and a second row, and the checker counts the rows.
SCHEMA = (
    f"CREATE TABLE {ORDERS} (request_no integer NOT NULL, message_id text NOT NULL,"
    " duplicated boolean NOT NULL, producer text NOT NULL,"
    " at timestamptz NOT NULL DEFAULT clock_timestamp())",
    f"CREATE INDEX {ORDERS}_message ON {ORDERS} (message_id)",
    f"CREATE TABLE {EFFECTS} (message_id text NOT NULL, request_no integer NOT NULL,"
    " consumer text NOT NULL, attempt integer NOT NULL, delivery_count integer,"
    " redelivered boolean NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
    f"CREATE INDEX {EFFECTS}_message ON {EFFECTS} (message_id)",
)


@dataclass(frozen=True)
class Spec:
    """One run's parameters, written to ``spec.json`` for the worker processes.

    Attributes:
        pg_port: the private cluster's port on 127.0.0.1.
        amqp_url: the RabbitMQ URL.
        queue: the queue (and ``<queue>.dead``), unique per run.
        messages: order requests, hence distinct messages.
        duplicates: share of messages also written to the echo outbox.
        seed: decides payloads and which messages are duplicated.
        producers, relays, consumers: processes of each role.
        concurrency: handlers at once per consumer (and its pool size).
        producer_concurrency: requests in flight per producer.
        relay_batch: rows per relay batch.
        workdir: the run's directory (status files, logs).
        broker: ``"rabbitmq"`` or ``"kafka"`` (Tansu: :mod:`chaos.kafka`).
        kafka_bootstrap: the Kafka broker's ``host:port``.
    """

    pg_port: int
    amqp_url: str
    queue: str
    messages: int
    duplicates: float
    seed: int
    producers: int
    relays: int
    consumers: int
    concurrency: int
    producer_concurrency: int
    relay_batch: int
    workdir: str
    broker: str = "rabbitmq"
    kafka_bootstrap: str = "127.0.0.1:9092"

    def pg_url(self, application_name: str | None = None) -> str:
        """The private cluster, optionally naming the connecting application."""
        url = f"postgresql://postgres@127.0.0.1:{self.pg_port}/postgres"
        return f"{url}?application_name={application_name}" if application_name else url

    def duplicated(self, request_no: int) -> bool:
        """Whether request ``request_no``'s message is also written to the echo outbox."""
        return random.Random(self.seed * 1_000_003 + request_no).random() < self.duplicates

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> Spec:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return cls(**data)


def order_payload(spec: Spec, request_no: int) -> dict[str, Any]:
    """The upstream order request ``request_no`` (deterministic for a seed)."""
    rng = random.Random(spec.seed * 7_919 + request_no)
    return {
        "request": request_no,
        "customer": f"cust-{rng.randrange(max(10, spec.messages // 20)):05d}",
        "amount": rng.randrange(100, 50_000),
    }
