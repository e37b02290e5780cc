# SPDX-License-Identifier: MIT
"""The invariant checker: after the run has quiesced and its processes have stopped.

The expected messages are the ``orders`` rows: one message id per committed order.
Against them:

* **doubled** — rows beyond the first: ``effects`` rows of one message id, and
  ``orders`` rows of one request (the upstream inbox let a duplicate request through);
* **stuck** — a message that is not settled: an outbox row never published (pending
  or dead, in either outbox), a message left in the queue (the consumers have stopped
  and closed their channels, so an unacknowledged delivery is back in it), or an inbox
  record ``in_progress`` or ``failed`` (no terminal outcome), in either scope;
* **lost** — a message with no effect that is not stuck: it left the pipeline without
  its effect (dead-lettered, a ``dead`` record, or no trace at all).

Also counted, and failing the run like the three above: effects of message ids no
order has (``phantom``: a message published without its business row) and requests
with no order (``unproduced``: the producers did not finish, or an order went dead).
"""

from __future__ import annotations

import contextlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import psycopg

from chaos.spec import ECHO_OUTBOX, EFFECTS, ORDERS, OUTBOX, RECORDS

__all__ = ["Findings", "QueueContents", "check", "examples_of", "read_queue"]

MAX_QUEUE_READ = 200_000


@dataclass
class QueueContents:
    """What is left in a queue: its count and the message ids read from it."""

    count: int = 0
    ids: list[str] = field(default_factory=list)
    error: str | None = None


async def read_queue(url: str, queue: str) -> QueueContents:
    """Count ``queue`` and read the ids of what it holds (nothing is acknowledged: the
    messages stay, and go back to ready when the channel closes)."""
    found = QueueContents()
    try:
        conn = await aio_pika.connect(url)
    except Exception as exc:
        found.error = f"cannot connect: {exc!r}"
        return found
    try:
        channel = await conn.channel()
        q = await channel.declare_queue(queue, passive=True)
        result = q.declaration_result
        found.count = int(result.message_count or 0)
        for _ in range(min(found.count, MAX_QUEUE_READ)):
            message = await q.get(no_ack=False, fail=False, timeout=5)
            if message is None:
                break
            found.ids.append(message.message_id or "<no id>")
    except Exception as exc:
        found.error = f"{type(exc).__name__}: {exc}"
    finally:
        with contextlib.suppress(Exception):
            await conn.close()
    return found


@dataclass
class Findings:
    """Everything the checker found; see the module docstring for the definitions."""

    requests: int
    orders: int = 0
    messages: int = 0  # distinct message ids of the orders
    duplicated: int = 0  # orders whose message was also written to the echo outbox
    effects: int = 0
    doubled_effects: dict[str, int] = field(default_factory=dict)  # id -> rows (> 1)
    doubled_orders: dict[int, int] = field(default_factory=dict)  # request -> rows (> 1)
    stuck: dict[str, list[str]] = field(default_factory=dict)  # id -> where
    lost: dict[str, str] = field(default_factory=dict)  # id -> what is known of it
    phantom: dict[str, int] = field(default_factory=dict)  # unknown id -> rows
    unproduced: dict[int, str] = field(default_factory=dict)  # request -> why
    records: Counter[tuple[str, str]] = field(default_factory=Counter)  # (scope, state)
    outbox_left: Counter[tuple[str, str]] = field(default_factory=Counter)  # (table, state)
    queue_left: int = 0
    dead_letters: int = 0
    dead_letter_duplicates: int = 0  # dead-lettered copies of messages that have an effect
    broker_errors: list[str] = field(default_factory=list)

    @property
    def doubled(self) -> int:
        """Rows beyond the first: effects plus orders."""
        return sum(n - 1 for n in self.doubled_effects.values()) + sum(
            n - 1 for n in self.doubled_orders.values()
        )

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.doubled
            or self.stuck
            or self.phantom
            or self.unproduced
            or self.broker_errors
        )


def _where(stuck: dict[str, list[str]], message_id: str, place: str) -> None:
    stuck.setdefault(message_id, []).append(place)


def check(pg_url: str, requests: int, queue: QueueContents, dead: QueueContents) -> Findings:
    """Compare the database and what is left on the broker with the orders placed.

    Args:
        pg_url: the run's PostgreSQL.
        requests: how many order requests the producers had to place.
        queue: what is left in the main queue (after the consumers stopped).
        dead: what is in its dead-letter queue.
    """
    f = Findings(requests=requests, queue_left=queue.count, dead_letters=dead.count)
    for q, name in ((queue, "queue"), (dead, "dead-letter queue")):
        if q.error:
            f.broker_errors.append(f"{name}: {q.error}")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        order_rows = conn.execute(
            f"SELECT request_no, message_id, duplicated FROM {ORDERS}"
        ).fetchall()
        effect_counts: dict[str, int] = {
            str(m): int(n)
            for m, n in conn.execute(
                f"SELECT message_id, count(*) FROM {EFFECTS} GROUP BY message_id"
            )
        }
        records = conn.execute(
            f"SELECT scope, key, state, attempts, error FROM {RECORDS} WHERE state <> 'completed'"
        ).fetchall()
        record_states = conn.execute(
            f"SELECT scope, state, count(*) FROM {RECORDS} GROUP BY scope, state"
        ).fetchall()
        outbox_rows = [
            (table, *row)
            for table in (OUTBOX, ECHO_OUTBOX)
            for row in conn.execute(f"SELECT id, state, attempts, last_error FROM {table}")
        ]
    f.orders = len(order_rows)
    per_request: Counter[int] = Counter()
    message_of: dict[int, str] = {}
    expected: set[str] = set()
    for request_no, message_id, duplicated in order_rows:
        per_request[int(request_no)] += 1
        message_of[int(request_no)] = str(message_id)
        expected.add(str(message_id))
        f.duplicated += int(bool(duplicated))
    f.messages = len(expected)
    f.doubled_orders = {r: n for r, n in per_request.items() if n > 1}
    f.effects = sum(effect_counts.values())
    f.doubled_effects = {m: n for m, n in effect_counts.items() if n > 1}
    f.phantom = {m: n for m, n in effect_counts.items() if m not in expected}
    for scope, state, n in record_states:
        f.records[(str(scope), str(state))] = int(n)

    # stuck: not settled anywhere
    dead_records: dict[str, str] = {}
    order_records: dict[int, str] = {}
    for scope, key, state, attempts, error in records:
        text = f"record {scope} {state} (attempts {attempts}): {error or '-'}"
        if scope == "orders":
            request_no = int(str(key).removeprefix("order-"))
            order_records[request_no] = text
            if state != "dead":
                _where(f.stuck, message_of.get(request_no, str(key)), text)
        elif state == "dead":
            dead_records[str(key)] = text
        else:
            _where(f.stuck, str(key), text)
    for table, message_id, state, attempts, error in outbox_rows:
        f.outbox_left[(table, str(state))] += 1
        _where(f.stuck, str(message_id), f"{table} row {state} (attempts {attempts}): {error}")
    for message_id in queue.ids:
        _where(f.stuck, message_id, "left in the queue")
    if queue.count > len(queue.ids):
        _where(f.stuck, "<unread>", f"{queue.count - len(queue.ids)} more left in the queue")

    # lost: no effect, not stuck
    dead_lettered = Counter(dead.ids)
    for message_id in expected:
        if effect_counts.get(message_id, 0) or message_id in f.stuck:
            continue
        if message_id in dead_records:
            f.lost[message_id] = dead_records[message_id]
        elif dead_lettered[message_id]:
            f.lost[message_id] = "dead-lettered by the broker or the consumer"
        else:
            f.lost[message_id] = "no trace: no effect, no record, not in any queue or outbox"
    f.dead_letter_duplicates = sum(n for m, n in dead_lettered.items() if effect_counts.get(m))

    # requests with no order
    for request_no in range(requests):
        if request_no not in per_request:
            f.unproduced[request_no] = order_records.get(request_no, "never placed")
    return f


def examples_of(pg_url: str, message_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The rows a violation report shows for each message id."""
    found: dict[str, dict[str, Any]] = defaultdict(dict)
    if not message_ids:
        return found
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for mid, request_no, producer, at in conn.execute(
            f"SELECT message_id, request_no, producer, extract(epoch FROM at)"
            f" FROM {ORDERS} WHERE message_id = ANY(%s)",
            (message_ids,),
        ):
            found[mid]["order"] = {"request": request_no, "producer": producer, "at": float(at)}
        for mid, consumer, attempt, count, redelivered, at in conn.execute(
            f"SELECT message_id, consumer, attempt, delivery_count, redelivered,"
            f" extract(epoch FROM at) FROM {EFFECTS} WHERE message_id = ANY(%s) ORDER BY at",
            (message_ids,),
        ):
            found[mid].setdefault("effects", []).append(
                {
                    "consumer": consumer,
                    "attempt": attempt,
                    "delivery_count": count,
                    "redelivered": redelivered,
                    "at": float(at),
                }
            )
        for key, state, attempts, error, created, updated in conn.execute(
            f"SELECT key, state, attempts, error, extract(epoch FROM created_at),"
            f" extract(epoch FROM updated_at) FROM {RECORDS}"
            " WHERE scope = 'effects' AND key = ANY(%s)",
            (message_ids,),
        ):
            found[key]["record"] = {
                "state": state,
                "attempts": attempts,
                "error": error,
                "created_at": float(created),
                "updated_at": float(updated),
            }
    return found
