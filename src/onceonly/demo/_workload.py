# SPDX-License-Identifier: MIT
"""The demo's workload: N distinct "charge customer X amount Y" messages.

A workload is a pure function of ``(count, seed, duplicate_rate)``: both sides of the
demo process exactly the same messages in the same enqueue order. About
``duplicate_rate`` of the messages are enqueued a second time a few places later,
as a producer does when it retries a send whose acknowledgement it never saw.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

__all__ = ["Message", "Workload", "make_workload"]


@dataclass(frozen=True)
class Message:
    """One business message: charge ``customer`` ``amount`` cents, identified by ``id``."""

    id: str
    customer: str
    amount: int

    def to_payload(self) -> dict[str, Any]:
        """The message body as delivered to consumers."""
        return {"id": self.id, "customer": self.customer, "amount": self.amount}

    def to_json(self) -> str:
        """The body as stored in the queue."""
        return json.dumps(self.to_payload(), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Workload:
    """The messages and the order the producer enqueues them in (with its retries).

    Attributes:
        messages: the distinct messages, by id order.
        sends: what the producer enqueued; ids of ``messages``, some of them twice.
    """

    messages: tuple[Message, ...]
    sends: tuple[Message, ...]

    @property
    def producer_duplicates(self) -> int:
        """How many sends were producer retries of a message already sent."""
        return len(self.sends) - len(self.messages)


def make_workload(count: int, seed: int, duplicate_rate: float = 0.3) -> Workload:
    """Build ``count`` messages; about ``duplicate_rate`` of them are sent twice.

    Args:
        count: the number of distinct messages (at least 1).
        seed: makes the workload reproducible.
        duplicate_rate: the share of messages the producer sends a second time.

    Returns:
        The :class:`Workload`.
    """
    if count < 1:
        raise ValueError("the workload needs at least one message")
    if not 0.0 <= duplicate_rate <= 1.0:
        raise ValueError("duplicate_rate must be between 0 and 1")
    rng = random.Random(seed)
    customers = max(10, count // 20)
    width = len(str(count))
    messages = tuple(
        Message(
            id=f"charge-{i:0{width}d}",
            customer=f"cust-{rng.randrange(customers):04d}",
            amount=rng.randrange(100, 50_000),
        )
        for i in range(1, count + 1)
    )
    sends: list[Message] = []
    retries: list[tuple[int, Message]] = []  # (send position it is due at, message)
    for message in messages:
        sends.append(message)
        if rng.random() < duplicate_rate:
            # The retry goes out a little later: close enough that the two copies are
            # often delivered to two workers at the same time.
            retries.append((len(sends) + rng.randrange(0, 6), message))
        due = [r for r in retries if r[0] <= len(sends)]
        for r in due:
            retries.remove(r)
            sends.append(r[1])
    sends.extend(m for _, m in retries)
    return Workload(messages, tuple(sends))
