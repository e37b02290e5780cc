# SPDX-License-Identifier: MIT
"""The chaos run's drain follows the pipeline's progress, not the clock: on a slow
machine it waits past the planned deadline while messages keep settling, and stops only
when nothing progressed for ``stall`` seconds or at the absolute cap. No services: a
scripted pipeline stands in for the processes."""

from __future__ import annotations

import asyncio
import io
import time
from typing import Any

from chaos.headway import Headway
from chaos.monitor import Sample
from chaos.run import Options, Result, _drain_phase, _Progress


def sample(effected: int, *, orders: int = 100, ready: int = 0, outbox: int = 0) -> Sample:
    return Sample(
        orders=orders, effects=effected, effected=effected, outbox=outbox,
        unfinished=orders - effected, ready=ready,
    )  # fmt: skip


def test_a_new_best_is_headway_and_a_flapping_counter_is_not() -> None:
    """More effects is progress; a queue count going up and down again is not."""
    h = Headway(stall=5.0, since=0.0)
    assert h.observe(sample(10, ready=3), 1.0)
    assert h.observe(sample(11, ready=3), 2.0)
    assert not h.observe(sample(11, ready=5), 3.0)  # worse: no headway
    assert not h.observe(sample(11, ready=3), 4.0)  # back to the best seen: still none
    assert not h.observe(None, 5.0)  # no sample (database restarting): none
    assert not h.stalled(7.0) and h.stalled(7.1)
    assert h.observe(sample(11, ready=2), 8.0) and not h.stalled(12.0)


class _Pool:
    """Every process up, producers done, worker counters moving with the pipeline."""

    def __init__(self, pipeline: _Pipeline) -> None:
        self.pipeline = pipeline

    def tick(self, now: float | None = None) -> None:
        pass

    def producers_done(self) -> bool:
        return True

    def all_up(self) -> bool:
        return True

    def counts(self, role: str) -> dict[str, int]:
        return {"processed": self.pipeline.settled()}


class _Pipeline:
    """100 messages settling one per ``every`` seconds after ``start``, up to ``stop_at``
    settled (then nothing moves again)."""

    def __init__(self, every: float, stop_at: int = 100) -> None:
        self.start = time.monotonic()
        self.every = every
        self.stop_at = stop_at

    def settled(self) -> int:
        return min(self.stop_at, int((time.monotonic() - self.start) / self.every))

    async def sample(self) -> Sample:
        done = self.settled()
        return sample(done, ready=100 - done)


def _drain(pipeline: _Pipeline, *, until: float, cap: float, stall: float) -> Result:
    options = Options(messages=100, settle=0.3, stall=stall)
    result = Result(options=options)
    pool: Any = _Pool(pipeline)
    faults: Any = None  # not touched: progress lines are off
    monitor: Any = pipeline
    progress = _Progress(io.StringIO(), 0.0, time.monotonic())
    now = time.monotonic()
    asyncio.run(
        _drain_phase(options, pool, faults, monitor, progress, result, now, now + until, now + cap)
    )
    return result


def test_a_slow_pipeline_is_waited_for_past_the_deadline() -> None:
    """Settling steadily but slowly: the drain outlasts the deadline and ends quiescent."""
    started = time.monotonic()
    result = _drain(_Pipeline(every=0.02), until=0.5, cap=30.0, stall=1.0)
    took = time.monotonic() - started
    assert result.quiescent and result.drain_end == "quiescent", result
    assert result.overtime > 0.5  # the planned deadline alone would have cut it
    assert took < 10


def test_a_stalled_pipeline_ends_after_the_stall_window() -> None:
    """Nothing settles any more: not quiescent, ended by the stall, not the cap."""
    started = time.monotonic()
    result = _drain(_Pipeline(every=0.01, stop_at=40), until=0.5, cap=30.0, stall=1.0)
    took = time.monotonic() - started
    assert not result.quiescent and result.drain_end == "stalled", result
    assert took < 5


def test_the_absolute_cap_bounds_a_pipeline_that_never_ends() -> None:
    """Progressing for ever (far too slow): the cap ends the drain."""
    started = time.monotonic()
    result = _drain(_Pipeline(every=0.2), until=0.3, cap=1.5, stall=5.0)
    took = time.monotonic() - started
    assert not result.quiescent and result.drain_end == "cap", result
    assert 1.4 < took < 5
