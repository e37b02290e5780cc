# SPDX-License-Identifier: MIT
"""What a broker supplies to the consumer loop (:mod:`onceonly.brokers._loop`): a
:class:`Transport` that receives :class:`Incoming` deliveries and settles them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from onceonly._core.window import Bound

__all__ = ["Incoming", "Transport"]


@dataclass(frozen=True)
class Incoming:
    """One delivery as a transport received it.

    Attributes:
        broker_id: the message id the broker carried (``None``: the fallback decides).
        body: the body bytes.
        headers: the message headers.
        delivery_count: the broker's count (1 = first), when it keeps one.
        source: the queue, subject or stream.
        raw: the client's message object (``tx.delivery.raw``).
        label: names the delivery in logs until its message id is known.
        redelivered: the broker's redelivery flag (default: ``delivery_count > 1``).
        content_type: the body's content type (default: the ``content-type`` header).
        released: whether the broker has taken the delivery back from this consumer
            (Kafka: its partition went to another member in a rebalance): it is then
            neither run again nor retried, and a run it cut off is not a failed attempt
            (``None``: never).
    """

    broker_id: str | None
    body: bytes
    headers: Mapping[str, Any]
    delivery_count: int | None
    source: str
    raw: Any
    label: str
    redelivered: bool | None = None
    content_type: str | None = None
    released: Callable[[], bool] | None = None


class Transport(Protocol):
    """What a broker supplies to :class:`ConsumerLoop`.

    Attributes:
        where: names the consumed queue/stream in logs and in the dedup-window check.
        delays_retries: ``retry(d, delay)`` defers the redelivery itself; else the loop
            waits ``delay`` (holding the slot) and calls ``retry(d, 0)``.
        extend_every: seconds between lease extensions (``None``: none needed).
    """

    where: str
    delays_retries: bool
    extend_every: float | None

    async def open(self) -> None:
        """Connect, declare or bind; raise what stops the consumer from starting. A
        transport the broker pushes to starts with a window of one delivery (see
        :meth:`widen`)."""

    async def widen(self) -> None:
        """Let the broker push its full prefetch window ahead of ``receive`` (the loop
        calls it once a first delivery arrives; until then a restarted consumer holds
        one delivery at a time). A pulling transport fetches what ``receive`` asks for
        and does nothing here."""

    async def bounds(self, redeliveries: Callable[[float, str], Bound]) -> list[Bound]:
        """The broker's redelivery bounds for the dedup-window check (after ``open``)."""

    async def receive(self, limit: int) -> Sequence[Incoming]:
        """Up to ``limit`` deliveries (maybe none: after a poll timeout, or at once after
        :meth:`wake`). Never cancelled: a pull that is cut off may lose what it read. Raise
        :class:`~onceonly.BrokerUnavailable` for a failure worth retrying; anything
        else ends ``run()``."""

    def wake(self) -> None:
        """Make a ``receive`` waiting with no poll timeout return now (the loop stops)."""

    async def ack(self, d: Incoming) -> None:
        """Acknowledge: the broker forgets the message."""

    async def retry(self, d: Incoming, delay: float) -> None:
        """Hand the message back, to be redelivered after ``delay`` (0: at once)."""

    async def dead_letter(
        self, d: Incoming, headers: dict[str, Any], message_id: str | None
    ) -> None:
        """Publish the dead letter, confirmed; raise when it is not (no ack follows)."""

    async def extend(self, ds: Sequence[Incoming]) -> None:
        """Keep the broker from redelivering ``ds`` (in flight here) elsewhere."""

    async def stop_receiving(self) -> None:
        """Stop the broker from sending more (before the running handlers drain)."""

    async def close(self, graceful: bool) -> None:
        """Release what ``open`` took (after the running handlers ended)."""
