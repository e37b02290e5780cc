# SPDX-License-Identifier: MIT
"""Helpers for testing code that uses onceonly."""

from __future__ import annotations

import threading

__all__ = ["ManualClock"]


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
