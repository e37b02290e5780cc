# SPDX-License-Identifier: MIT
"""Duplicate lateness (spec §8.4): the bin of a replay, its lateness from the record,
the DuplicateRecorder's in-memory counts and flush, and the report built from rows."""

from __future__ import annotations

import time

import pytest

from onceonly._core.admin import BUCKET_SECONDS
from onceonly._core.lateness import (
    HALF_TTL,
    NEAR_TTL,
    RAN,
    UNKNOWN,
    lateness_bin,
    replay_lateness,
    sum_lateness,
)
from onceonly._core.state import Record, State
from onceonly.admin import DuplicateRecorder, LatenessReport
from onceonly.errors import ConfigurationError
from onceonly.events import Event, EventKind
from onceonly.stores.memory import MemoryStore

DAY = 86400.0


@pytest.mark.parametrize(
    ("lateness", "ttl", "expected"),
    [
        (0.0, None, 1),
        (0.999, None, 1),
        (1.0, None, 2),  # each edge belongs to the bin above it
        (9.9, None, 2),
        (10.0, None, 3),
        (59.0, None, 3),
        (60.0, None, 4),
        (599.0, None, 4),
        (600.0, None, 5),
        (3599.0, None, 5),
        (3600.0, None, 6),
        (6 * 3600.0, None, 7),
        (DAY - 1, None, 7),
        (DAY, None, 8),
        (7 * DAY - 1, None, 8),
        (7 * DAY, None, 9),
        (400 * DAY, None, 9),
        (30.0, 3600.0, 3),  # well inside the ttl: the seconds bin
        (1799.0, 3600.0, 5),
        (1800.0, 3600.0, HALF_TTL),  # half the ttl
        (3239.0, 3600.0, HALF_TTL),
        (3240.0, 3600.0, NEAR_TTL),  # 90 % of the ttl
        (3599.0, 3600.0, NEAR_TTL),
        (4.0 * DAY, 7 * DAY, HALF_TTL),  # the ttl bins win over "< 7 d"
        (None, 3600.0, UNKNOWN),
        (5.0, 0.0, 2),  # a zero ttl has no ttl bins
    ],
)
def test_lateness_bin(lateness: float | None, ttl: float | None, expected: int) -> None:
    """Log-spaced seconds bins, the two ttl bins above them, unknown apart."""
    assert lateness_bin(lateness, ttl) == expected


def test_replay_lateness_from_the_record_and_now() -> None:
    """now - completed_at and expires_at - completed_at; never negative; None if unknown."""
    done = Record("s", "k", State.COMPLETED, None, 1, 0, completed_at=100.0, expires_at=160.0)
    assert replay_lateness(done, 130.0) == (30.0, 60.0)
    assert replay_lateness(done, 99.0) == (0.0, 60.0)
    forever = Record("s", "k", State.COMPLETED, None, 1, 0, completed_at=100.0)
    assert replay_lateness(forever, 130.5) == (30.5, None)
    assert replay_lateness(Record("s", "k", State.COMPLETED, None, 1, 0), 5.0) == (None, None)


def test_sum_lateness_groups_by_interval_and_keeps_the_largest_ttl() -> None:
    """Rows from since on, summed per scope, step-aligned start and bin."""
    rows: list[tuple[str, int, int, int, float | None]] = [
        ("a", 600, 1, 2, 60.0),
        ("a", 660, 1, 3, 90.0),
        ("a", 720, 1, 1, None),
        ("a", 540, 1, 100, 1.0),  # before since
        ("b", 660, RAN, 4, None),
    ]
    assert sum_lateness(rows, 600, 120) == [
        ("a", 600, 1, 5, 90.0),
        ("a", 720, 1, 1, None),
        ("b", 600, RAN, 4, None),
    ]


def _event(
    kind: EventKind, scope: str, lateness: float | None = None, ttl: float | None = None
) -> Event:
    return Event(kind, scope, "k", lateness=lateness, ttl=ttl)


def test_recorder_counts_in_memory_and_flushes_one_row_per_bucket() -> None:
    """Runs go to RAN, replays to their bin; a flush upserts each (scope, minute, bin)
    once, adds to what is stored, and empties memory; other events are not counted."""
    store = MemoryStore()
    recorder = DuplicateRecorder(store, background=False)
    for _ in range(3):
        recorder(_event(EventKind.COMPLETED, "a"))
    recorder(_event(EventKind.FAILED, "a"))
    recorder(_event(EventKind.REPLAYED, "a", 0.2, 3600.0))
    recorder(_event(EventKind.REPLAYED, "a", 0.7, 7200.0))
    recorder(_event(EventKind.REPLAYED, "a", 3500.0, 3600.0))
    recorder(_event(EventKind.REPLAYED, "b", 20.0, None))
    recorder(_event(EventKind.IN_FLIGHT, "a"))
    recorder(_event(EventKind.LEASE_RENEWED, "a"))
    minute = int(time.time()) // BUCKET_SECONDS * BUCKET_SECONDS
    assert recorder.flush() == 4
    stored = recorder.records.read_lateness(0, BUCKET_SECONDS)
    got = {(s, b): (n, ttl) for s, t, b, n, ttl in stored if t >= minute - BUCKET_SECONDS}
    assert got == {
        ("a", RAN): (4, None),
        ("a", 1): (2, 7200.0),
        ("a", NEAR_TTL): (1, 3600.0),
        ("b", 3): (1, None),
    }
    assert recorder.flush() == 0  # nothing new
    recorder(_event(EventKind.REPLAYED, "b", 25.0, None))
    recorder.close()  # close writes the rest
    again = recorder.records.read_lateness(0, 3600)
    assert [(s, b, n) for s, _, b, n, _ in again if s == "b"] == [("b", 3, 2)]


def test_recorder_background_thread_flushes_periodically() -> None:
    """With background=True the counts reach the store without a flush call."""
    store = MemoryStore()
    with DuplicateRecorder(store, flush_seconds=0.05) as recorder:
        recorder(_event(EventKind.REPLAYED, "a", 1.5, None))
        deadline = time.monotonic() + 5
        while not recorder.records.read_lateness(0, 60) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [r[2:4] for r in recorder.records.read_lateness(0, 60)] == [(2, 1)]


def test_recorder_refuses_a_non_positive_interval() -> None:
    """flush_seconds must be positive."""
    with pytest.raises(ConfigurationError):
        DuplicateRecorder(MemoryStore(), flush_seconds=0)


def test_report_from_rows_histogram_rate_and_ttl() -> None:
    """Bins summed over scopes, per-scope bins, the largest ttl, and the rate per
    interval (claims = runs + duplicates); rows outside the intervals left out."""
    rows: list[tuple[str, int, int, int, float | None]] = [
        ("a", 0, RAN, 6, None),
        ("a", 0, 1, 2, 60.0),
        ("a", 120, NEAR_TTL, 1, 90.0),
        ("b", 120, RAN, 1, None),
        ("b", 120, 2, 3, None),
        ("a", 999, 1, 50, 1.0),  # not an interval's start
    ]
    report = LatenessReport.from_rows(rows, [0, 120], 120, 240.0)
    assert report.recorded and report.duplicates == 6
    assert report.bins[1] == 2 and report.bins[2] == 3 and report.bins[NEAR_TTL] == 1
    assert report.by_scope["a"][1] == 2 and report.by_scope["a"][NEAR_TTL] == 1
    assert report.ttl == {"a": 90.0, "b": None}
    assert report.points[0].counts == {"a": (8, 2)}
    assert report.points[1].counts == {"a": (1, 1), "b": (4, 3)}
    assert report.points[1].rate("b") == 0.75
    assert not LatenessReport.from_rows([], [0], 60, 60.0).recorded
