# SPDX-License-Identifier: MIT
"""Helpers for testing code that uses onceonly."""

from __future__ import annotations

import threading

from onceonly.brokers import DeadLetter, MemoryBroker, MemoryConsumer, MemoryMessage
from onceonly.errors import PublishError
from onceonly.messaging import OutboxMessage

__all__ = [
    "AsyncListPublisher",
    "DeadLetter",
    "ListPublisher",
    "ManualClock",
    "MemoryBroker",
    "MemoryConsumer",
    "MemoryMessage",
]


class ManualClock:
    """A clock that moves only when told to; pass it to ``MemoryStore(clock=...)``.

    .. versionadded:: 0.1
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        with self._lock:
            self._now += seconds


class ListPublisher:
    """A publisher that keeps what it is given, for tests of code that uses the outbox.

    ``fail`` maps a topic to the number of publishes of that topic that raise
    :class:`~onceonly.PublishError` before it starts succeeding (``-1``: always).

    .. versionadded:: 0.1
    """

    def __init__(self, fail: dict[str, int] | None = None) -> None:
        self.messages: list[OutboxMessage] = []
        self.fail = dict(fail or {})
        self._lock = threading.Lock()

    def _publish(self, message: OutboxMessage) -> None:
        with self._lock:
            left = self.fail.get(message.topic, 0)
            if left != 0:
                self.fail[message.topic] = left - 1 if left > 0 else left
                raise PublishError(f"refused {message.topic}", key=message.id)
            self.messages.append(message)

    def publish(self, message: OutboxMessage) -> None:
        self._publish(message)

    def close(self) -> None:
        """Nothing to release."""


class AsyncListPublisher(ListPublisher):
    """The async form of :class:`ListPublisher`."""

    async def publish(self, message: OutboxMessage) -> None:  # type: ignore[override]
        self._publish(message)

    async def close(self) -> None:  # type: ignore[override]
        """Nothing to release."""
