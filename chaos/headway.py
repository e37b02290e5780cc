# SPDX-License-Identifier: MIT
"""Whether a draining pipeline still moves: the run's deadline follows its progress.

A loaded machine makes every step slower, not wrong. A drain cut at a fixed clock
reports as *stuck* the messages still on their way, so the verdict would depend on the
machine's load. Instead the drain waits past the planned deadline while the pipeline
keeps making headway, and gives up only when nothing progressed for ``stall`` seconds
(or at the absolute cap, which bounds every run).

Headway is a new best on a measure that only a working pipeline improves: more orders
placed, more messages with their effect, fewer pending outbox rows, fewer unfinished
records, fewer messages ready in the queue. Counters that merely change (a message
redelivered back and forth) do not count, so a livelock cannot extend the run: each
measure is a whole number bounded by the workload, so it can improve only so often.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chaos.monitor import Sample

__all__ = ["Headway"]


@dataclass
class Headway:
    """The best value seen of each progress measure, and when the last one improved.

    Args:
        stall: seconds without headway after which the pipeline counts as stalled.
        since: the time (monotonic) the watch starts; it counts as headway.
    """

    stall: float
    since: float
    moved_at: float = field(init=False)
    orders: int = field(default=-1, init=False)
    effected: int = field(default=-1, init=False)
    outbox: int | None = field(default=None, init=False)
    unfinished: int | None = field(default=None, init=False)
    ready: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.moved_at = self.since

    def observe(self, sample: Sample | None, now: float) -> bool:
        """Take ``sample`` (``None``: none could be taken) at ``now``; whether it is
        headway (a new best on some measure)."""
        if sample is None:
            return False
        moved = False
        if sample.orders > self.orders:
            self.orders, moved = sample.orders, True
        if sample.effected > self.effected:
            self.effected, moved = sample.effected, True
        for name in ("outbox", "unfinished", "ready"):
            best: int | None = getattr(self, name)
            value: int = getattr(sample, name)
            if best is None or value < best:
                setattr(self, name, value)
                moved = True
        if moved:
            self.moved_at = now
        return moved

    def stalled(self, now: float) -> bool:
        """Whether nothing progressed for more than ``stall`` seconds before ``now``."""
        return now - self.moved_at > self.stall

    def idle(self, now: float) -> float:
        """Seconds since the last headway."""
        return now - self.moved_at
