# SPDX-License-Identifier: MIT
"""An in-memory broker and its consumer, for tests (exported by :mod:`onceonly.testing`).

:class:`MemoryBroker` keeps named queues in one process. It counts deliveries like a
quorum queue, redelivers what is handed back (after the given delay) and what a
stopped consumer held, and keeps dead letters per queue. :class:`MemoryConsumer` runs
it through the same :class:`~onceonly.brokers._loop.ConsumerLoop` as the real brokers,
so a handler tested on it is settled exactly as in production.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from onceonly._core.window import Bound
from onceonly.brokers._consumer import Handler, MessageIds
from onceonly.brokers._loop import ConsumerLoop
from onceonly.brokers._transport import Incoming
from onceonly.errors import ConfigurationError, PublishError
from onceonly.inbox import AsyncInbox
from onceonly.messaging import HEADER_KEY, OutboxMessage

__all__ = ["DeadLetter", "MemoryBroker", "MemoryConsumer", "MemoryMessage"]

log = logging.getLogger("onceonly.brokers.memory")


@dataclass
class MemoryMessage:
    """A message in a :class:`MemoryBroker` queue (``tx.delivery.raw``)."""

    body: bytes
    message_id: str | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    deliveries: int = 0
    tag: int = 0


@dataclass(frozen=True)
class DeadLetter:
    """A dead letter: the original body with the ``onceonly-*`` headers."""

    body: bytes
    headers: Mapping[str, Any]
    message_id: str | None

    def payload(self) -> Any:
        return json.loads(self.body)


class _Queue:
    def __init__(self) -> None:
        self.ready: deque[MemoryMessage] = deque()
        self.unacked: dict[int, MemoryMessage] = {}
        self.arrived = asyncio.Event()


class MemoryBroker:
    """Named in-memory queues; also an outbox publisher (``publish(OutboxMessage)``
    appends to the queue named by the topic).

    Attributes:
        dead_letters: the dead letters of each queue, in order.
        fail_dead_letters: how many dead-letter publishes fail from now on (``-1``:
            all), to test that a failed dead letter is never acked.
        acked: the messages acked on each queue, in order.

    .. versionadded:: 0.3
    """

    def __init__(self) -> None:
        self._queues: dict[str, _Queue] = {}
        self._tags = itertools.count(1)
        self.dead_letters: dict[str, list[DeadLetter]] = {}
        self.acked: dict[str, list[MemoryMessage]] = {}
        self.fail_dead_letters = 0

    def queue(self, name: str) -> _Queue:
        return self._queues.setdefault(name, _Queue())

    def send(
        self,
        queue: str,
        payload: Any = None,
        *,
        body: bytes | None = None,
        message_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> None:
        """Put a message on ``queue``: ``payload`` as JSON, or raw ``body`` bytes."""
        data = body if body is not None else json.dumps(payload).encode("utf-8")
        self._put(queue, MemoryMessage(data, message_id, dict(headers or {})))

    def _put(self, queue: str, message: MemoryMessage) -> None:
        q = self.queue(queue)
        q.ready.append(message)
        q.arrived.set()

    async def publish(self, message: OutboxMessage) -> None:
        """Outbox publisher: the topic names the queue."""
        headers = dict(message.headers)
        if message.key is not None:
            headers[HEADER_KEY] = message.key
        self._put(message.topic, MemoryMessage(message.body, message.id, headers))

    async def connect(self) -> None:
        """Nothing to connect."""

    async def close(self) -> None:
        """Nothing to release."""

    def depth(self, queue: str) -> int:
        """Messages ready or unacked on ``queue``."""
        q = self.queue(queue)
        return len(q.ready) + len(q.unacked)


class MemoryTransport:
    """The :class:`~onceonly.brokers._loop.Transport` of a :class:`MemoryBroker` queue."""

    delays_retries = True
    extend_every: float | None = None

    def __init__(self, broker: MemoryBroker, queue: str, dead_letter: str) -> None:
        self.broker = broker
        self.name = queue
        self.dead_letter_queue = dead_letter
        self.where = f"memory queue {queue}"
        self._held: dict[int, MemoryMessage] = {}
        self._timers: dict[asyncio.TimerHandle, MemoryMessage] = {}
        self._woken = False

    async def open(self) -> None:
        self.broker.queue(self.name)
        self._woken = False

    async def bounds(self, redeliveries: Callable[[float, str], Bound]) -> list[Bound]:
        return []

    async def receive(self, limit: int) -> Sequence[Incoming]:
        q = self.broker.queue(self.name)
        if not q.ready and not self._woken:
            q.arrived.clear()
            await q.arrived.wait()
        out: list[Incoming] = []
        while q.ready and len(out) < limit:
            m = q.ready.popleft()
            m.deliveries += 1
            m.tag = next(self.broker._tags)
            q.unacked[m.tag] = self._held[m.tag] = m
            label = m.message_id or f"delivery {m.tag}"
            out.append(Incoming(m.message_id, m.body, m.headers, m.deliveries, self.name, m, label))
        return out

    async def widen(self) -> None:
        """Nothing to widen: ``receive`` pulls only what the loop asks for."""

    def wake(self) -> None:
        self._woken = True
        self.broker.queue(self.name).arrived.set()

    def _take(self, d: Incoming) -> MemoryMessage | None:
        m: MemoryMessage = d.raw
        self._held.pop(m.tag, None)
        return self.broker.queue(self.name).unacked.pop(m.tag, None)

    async def ack(self, d: Incoming) -> None:
        m = self._take(d)
        if m is not None:
            self.broker.acked.setdefault(self.name, []).append(m)

    async def retry(self, d: Incoming, delay: float) -> None:
        m = self._take(d)
        if m is None:
            return
        if delay <= 0:
            self.broker._put(self.name, m)
            return
        box: list[asyncio.TimerHandle] = []
        box.append(asyncio.get_running_loop().call_later(delay, lambda: self._requeue(box[0])))
        self._timers[box[0]] = m

    def _requeue(self, timer: asyncio.TimerHandle) -> None:
        m = self._timers.pop(timer, None)
        if m is not None:
            self.broker._put(self.name, m)

    async def dead_letter(
        self, d: Incoming, headers: dict[str, Any], message_id: str | None
    ) -> None:
        if self.broker.fail_dead_letters:
            self.broker.fail_dead_letters -= 1 if self.broker.fail_dead_letters > 0 else 0
            raise PublishError(f"dead letter to {self.dead_letter_queue} refused")
        dead = DeadLetter(d.body, dict(headers), d.broker_id or message_id)
        self.broker.dead_letters.setdefault(self.dead_letter_queue, []).append(dead)

    async def extend(self, ds: Sequence[Incoming]) -> None:
        """Nothing expires here."""

    async def stop_receiving(self) -> None:
        """Nothing to cancel: the loop stops asking."""

    async def close(self, graceful: bool) -> None:
        # like a closed channel: what this consumer held goes back to the queue
        for m in list(self._held.values()):
            if self.broker.queue(self.name).unacked.pop(m.tag, None) is not None:
                self.broker._put(self.name, m)
        self._held.clear()
        for timer, m in self._timers.items():  # waiting for their retry: due now
            timer.cancel()
            self.broker._put(self.name, m)
        self._timers.clear()


class MemoryConsumer(ConsumerLoop):
    """Consumes a :class:`MemoryBroker` queue through an inbox, settled like the real
    brokers' consumers (same loop, same verdicts, same dead-letter headers).

    Args:
        inbox: the inbox.
        handler: ``async handler(payload, tx)``.
        broker: the broker.
        queue: the queue to consume.
        dead_letter: the dead-letter queue (default ``"<queue>.dead"``).
        concurrency: handlers running at once.
        max_deliveries: as for the broker consumers.
        retry_delay: as for the broker consumers.
        max_backoff: as for the broker consumers.
        message_id: as for the broker consumers.
        shutdown_timeout: as for the broker consumers.
        dedup_window: as for the broker consumers.
        batch_size: deliveries processed together in one inbox transaction
            (``inbox.process_batch``: one commit, each settled by its own outcome);
            1 (the default) runs one at a time. Deliveries in flight are at least
            ``batch_size``.
        batch_wait: seconds a batch waits for more deliveries once the first arrived.

    .. versionadded:: 0.3
    .. versionchanged:: 0.3 ``batch_size``, ``batch_wait``.
    """

    def __init__(
        self,
        inbox: AsyncInbox,
        handler: Handler,
        *,
        broker: MemoryBroker,
        queue: str,
        dead_letter: str | None = None,
        concurrency: int = 16,
        max_deliveries: int | None = None,
        retry_delay: float = 0.1,
        max_backoff: float = 5.0,
        message_id: MessageIds | str | Callable[[Any], str] | None = None,
        shutdown_timeout: float = 30.0,
        dedup_window: str = "warn",
        batch_size: int = 1,
        batch_wait: float = 0.01,
    ) -> None:
        if not queue:
            raise ConfigurationError("queue must be non-empty")
        super().__init__(
            inbox,
            handler,
            message_id=message_id,
            max_deliveries=max_deliveries,
            retry_delay=retry_delay,
            max_backoff=max_backoff,
            dedup_window=dedup_window,
            concurrency=concurrency,
            shutdown_timeout=shutdown_timeout,
            logger=log,
            batch_size=batch_size,
            batch_wait=batch_wait,
        )
        self.queue = queue
        self.dead_letter = dead_letter or f"{queue}.dead"
        self.transport = MemoryTransport(broker, queue, self.dead_letter)
