# SPDX-License-Identifier: MIT
"""How late duplicates arrive (docs/spec.md §8.4): the lateness of a replay and the bins
a :class:`~onceonly.DuplicateRecorder` counts it in. Pure: record and time in, numbers
out.

* The **lateness** of a duplicate is the store's now at the replay decision minus the
  record's ``completed_at`` (both on the store's clock), never negative. Its **ttl** is
  the record's ``expires_at - completed_at`` (``None``: kept for ever).
* Each delivery is counted in exactly one **bin**: :data:`RAN` for a delivery whose
  handler ran (the rate's denominator with the duplicates); a duplicate goes to
  :data:`NEAR_TTL` at 90 % of its ttl or later, to :data:`HALF_TTL` at 50 % or later,
  else to the log-spaced bin of its lateness in seconds (``< 1 s`` … ``≥ 7 d``);
  :data:`UNKNOWN` when no lateness came with it. A replay never comes after the ttl
  (a record past ``expires_at`` behaves as absent: that duplicate runs again), so the
  two ttl bins are where a too-short window shows.
* Bins are stored as these integers: they never change meaning; new bins get new
  numbers.
"""

from __future__ import annotations

import bisect
from typing import Any

from onceonly._core.state import Record

__all__ = [
    "BIN_LABELS",
    "DUPLICATE_BINS",
    "HALF_TTL",
    "NEAR_TTL",
    "RAN",
    "SECONDS_EDGES",
    "UNKNOWN",
    "lateness_bin",
    "max_ttl",
    "replay_lateness",
    "sum_lateness",
]

RAN = 0  # the handler ran: not a duplicate
# Upper edges (exclusive) of the seconds bins 1..8; bin 9 is the rest (>= 7 days).
SECONDS_EDGES: tuple[float, ...] = (1, 10, 60, 600, 3600, 6 * 3600, 86400, 7 * 86400)
HALF_TTL = 10  # a duplicate at >= 50 % (and < 90 %) of its record's ttl
NEAR_TTL = 11  # a duplicate at >= 90 % of its record's ttl
UNKNOWN = 12  # a duplicate whose lateness was not known
HALF, NEAR = 0.5, 0.9

BIN_LABELS: dict[int, str] = {
    RAN: "ran",
    1: "< 1 s",
    2: "< 10 s",
    3: "< 1 min",
    4: "< 10 min",
    5: "< 1 h",
    6: "< 6 h",
    7: "< 1 d",
    8: "< 7 d",
    9: "≥ 7 d",
    HALF_TTL: "≥ ½ ttl",
    NEAR_TTL: "≥ 0.9 ttl",
    UNKNOWN: "unknown",
}
# The histogram's bars, in axis order (every bin but RAN).
DUPLICATE_BINS: tuple[int, ...] = (*range(1, 10), HALF_TTL, NEAR_TTL)


def replay_lateness(record: Record, now: float) -> tuple[float | None, float | None]:
    """The lateness and the ttl of a duplicate of ``record`` replayed at ``now``.

    Args:
        record: the completed record the duplicate replays.
        now: the store's clock at the decision, epoch seconds.

    Returns:
        ``(lateness, ttl)`` in seconds; ``lateness`` is ``None`` when the record has no
        ``completed_at``, ``ttl`` is ``None`` when it never expires.
    """
    done = record.completed_at
    if done is None:
        return None, None
    ttl = None if record.expires_at is None else max(0.0, record.expires_at - done)
    return max(0.0, now - done), ttl


def lateness_bin(lateness: float | None, ttl: float | None) -> int:
    """The bin of a duplicate ``lateness`` seconds after its record completed.

    Args:
        lateness: seconds (``None``: unknown).
        ttl: the record's ttl in seconds (``None`` or 0: no ttl bins).

    Returns:
        A bin number (see the module docstring).
    """
    if lateness is None:
        return UNKNOWN
    if ttl:
        if lateness >= NEAR * ttl:
            return NEAR_TTL
        if lateness >= HALF * ttl:
            return HALF_TTL
    return 1 + bisect.bisect_right(SECONDS_EDGES, lateness)


def max_ttl(a: float | None, b: float | None) -> float | None:
    """The larger of two ttls, ``None`` counting as unknown (not as "for ever")."""
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def sum_lateness(
    rows: list[tuple[str, int, int, int, float | None]], since: float, step: int
) -> list[tuple[str, int, int, int, float | None]]:
    """What a store's ``read_lateness`` answers, from its ``(scope, bucket, bin, n, ttl)``
    rows: buckets from ``since`` on, summed per scope, interval of ``step`` seconds
    (starting at a multiple of ``step``) and bin, with the largest ttl; sorted.

    Args:
        rows: stored rows.
        since: the first bucket to count, epoch seconds.
        step: the interval's length in seconds (positive).

    Returns:
        ``(scope, start, bin, n, ttl)`` rows.
    """
    out: dict[tuple[str, int, int], list[Any]] = {}
    for scope, bucket, b, n, ttl in rows:
        if bucket < since:
            continue
        row = out.setdefault((scope, bucket - bucket % step, b), [0, None])
        row[0] += n
        row[1] = max_ttl(row[1], ttl)
    return [(s, t, b, n, ttl) for (s, t, b), (n, ttl) in sorted(out.items())]
