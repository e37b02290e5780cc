# SPDX-License-Identifier: MIT
"""Counting charges and printing the demo's table, verdict and progress bar.

Definitions (one charge is one row of a charges table):

* expected charges: one per distinct message;
* double charges: for each message id charged ``n > 1`` times, ``n - 1``;
* lost charges: messages charged zero times;
* duplicates delivered: deliveries minus messages;
* messages/s: messages divided by the wall time of the side.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

__all__ = [
    "ChargeCount",
    "Progress",
    "SideResult",
    "count_charges",
    "render_table",
    "verdict",
]


@dataclass(frozen=True)
class ChargeCount:
    """The charges of one side, checked against the messages.

    Attributes:
        expected: charges that should exist (one per message).
        observed: charges that exist.
        double: charges beyond the first of a message.
        lost: messages never charged.
        unknown: charges of ids that are not messages of the workload.
        overcharged: the amount charged by the double charges.
    """

    expected: int
    observed: int
    double: int
    lost: int
    unknown: int
    overcharged: int

    @property
    def exact(self) -> bool:
        """Whether every message was charged exactly once and nothing else was."""
        return self.double == 0 and self.lost == 0 and self.unknown == 0


def count_charges(message_ids: Iterable[str], charges: Iterable[tuple[str, int]]) -> ChargeCount:
    """Compare charges ``(message_id, amount)`` with the ids that should be charged once.

    Args:
        message_ids: the distinct message ids of the workload.
        charges: every charge row.

    Returns:
        The :class:`ChargeCount`.
    """
    expected = set(message_ids)
    per_id: Counter[str] = Counter()
    overcharged = observed = 0
    for message_id, amount in charges:
        observed += 1
        per_id[message_id] += 1
        if per_id[message_id] > 1:
            overcharged += amount
    return ChargeCount(
        expected=len(expected),
        observed=observed,
        double=sum(n - 1 for m, n in per_id.items() if n > 1 and m in expected),
        lost=sum(1 for m in expected if per_id[m] == 0),
        unknown=sum(n for m, n in per_id.items() if m not in expected),
        overcharged=overcharged,
    )


# Counters of deliveries that were acknowledged; every other counter is a retry.
ACKED_COUNTERS = frozenset({"skipped", "dead-lettered"})


@dataclass(frozen=True)
class SideResult:
    """Everything the table shows about one side.

    Attributes:
        name: ``"naive"`` or ``"onceonly"``.
        messages: distinct messages in the workload.
        deliveries: leases the broker handed out.
        crashes: workers killed with SIGKILL.
        charges: the charges counted after the run.
        seconds: the side's wall time.
        counters: other broker counters (``skipped``, ``in flight``, ``error: …``).
    """

    name: str
    messages: int
    deliveries: int
    crashes: int
    charges: ChargeCount
    seconds: float
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def duplicates(self) -> int:
        """Deliveries beyond the first of each message."""
        return self.deliveries - self.messages

    @property
    def rate(self) -> float:
        """Messages per second of wall time."""
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def retried(self) -> int:
        """Deliveries left unacknowledged after an error or a concurrent duplicate."""
        return sum(n for k, n in self.counters.items() if k not in ACKED_COUNTERS)


def _money(cents: int) -> str:
    return f"{cents // 100:,}.{cents % 100:02d}"


def render_table(results: Sequence[SideResult]) -> str:
    """The comparison table, one column per side, aligned, plain text."""
    rows: list[tuple[str, list[str]]] = [
        ("messages", [f"{r.messages:,}" for r in results]),
        ("deliveries", [f"{r.deliveries:,}" for r in results]),
        ("duplicates delivered", [f"{r.duplicates:,}" for r in results]),
        ("crashes (SIGKILL)", [f"{r.crashes:,}" for r in results]),
        ("duplicates skipped", [f"{r.counters.get('skipped', 0):,}" for r in results]),
        ("deliveries retried", [f"{r.retried:,}" for r in results]),
        ("charges expected", [f"{r.charges.expected:,}" for r in results]),
        ("charges observed", [f"{r.charges.observed:,}" for r in results]),
        ("double charges", [f"{r.charges.double:,}" for r in results]),
        ("lost charges", [f"{r.charges.lost:,}" for r in results]),
        ("amount overcharged", [_money(r.charges.overcharged) for r in results]),
        ("messages/s", [f"{r.rate:,.0f}" for r in results]),
    ]
    header = ["", *(r.name for r in results)]
    label_width = max(len(label) for label, _ in rows)
    widths = [
        max(len(header[i + 1]), *(len(values[i]) for _, values in rows))
        for i in range(len(results))
    ]
    lines = [
        "  ".join(
            [" " * label_width, *(h.rjust(w) for h, w in zip(header[1:], widths, strict=True))]
        )
    ]
    lines.append("  ".join(["-" * label_width, *("-" * w for w in widths)]))
    for label, values in rows:
        cells = (v.rjust(w) for v, w in zip(values, widths, strict=True))
        lines.append("  ".join([label.ljust(label_width), *cells]))
    return "\n".join(line.rstrip() for line in lines)


def verdict(result: SideResult) -> tuple[bool, str]:
    """Whether ``result`` charged every message exactly once, and a one-line verdict."""
    c = result.charges
    if c.exact:
        return True, f"{result.name}: every message charged exactly once"
    problems = []
    if c.double:
        problems.append(f"{c.double} double charge{'s' if c.double != 1 else ''}")
    if c.lost:
        problems.append(f"{c.lost} lost charge{'s' if c.lost != 1 else ''}")
    if c.unknown:
        problems.append(f"{c.unknown} charge{'s' if c.unknown != 1 else ''} of unknown messages")
    return False, f"{result.name}: FAILED, " + ", ".join(problems)


class Progress:
    """A one-line progress bar on a terminal (``\\r`` rewrites; nothing otherwise).

    Args:
        stream: where to draw (stderr).
        enabled: draw at all; false when not a TTY or with ``--no-progress``.
    """

    WIDTH = 30

    def __init__(self, stream: TextIO | None = None, *, enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._label = ""
        self._last = 0.0
        self._started = time.monotonic()
        self._shown = 0
        self._state = (0, 0, 0)

    def start(self, label: str) -> None:
        """Begin a new bar."""
        self._label = label
        self._started = time.monotonic()
        self._last = 0.0

    def update(self, done: int, total: int, crashes: int = 0, *, force: bool = False) -> None:
        """Redraw (at most ten times a second unless ``force``)."""
        self._state = (done, total, crashes)
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        share = done / total if total else 1.0
        filled = int(share * self.WIDTH)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        line = (
            f"{self._label:<9} [{bar}] {int(share * 100):3d}%  {done:,}/{total:,} acked"
            f"  {crashes} killed  {now - self._started:4.1f}s"
        )
        pad = " " * max(0, self._shown - len(line))
        self.stream.write(f"\r{line}{pad}")
        self.stream.flush()
        self._shown = len(line)

    def finish(self) -> None:
        """Draw the last state again and end the line."""
        if not self.enabled:
            return
        self.update(*self._state, force=True)
        self.stream.write("\n")
        self.stream.flush()
        self._shown = 0
