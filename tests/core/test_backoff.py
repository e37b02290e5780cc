# SPDX-License-Identifier: MIT
"""The retry delays of ``_core.backoff``: the one in-flight wait and the outage retry."""

from __future__ import annotations

import pytest

from onceonly._core.backoff import backoff_delay, in_flight_delay, outage_delay


def test_in_flight_delay_doubles_from_10_ms_up_to_half_a_second() -> None:
    """The pauses between looks at a held key double from 10 ms and stop at 0.5 s."""
    pauses = [in_flight_delay(n, None, 60.0) for n in range(1, 10)]
    assert pauses == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.5, 0.5, 0.5])


def test_in_flight_delay_never_outlasts_the_lease_nor_the_deadline() -> None:
    """A pause ends when the holder's lease runs out, or when the caller stops waiting."""
    assert in_flight_delay(7, 0.03, 60.0) == pytest.approx(0.03)
    assert in_flight_delay(7, 5.0, 0.2) == pytest.approx(0.2)
    assert in_flight_delay(1, 0.0, 60.0) == pytest.approx(0.01)  # no lease left: the step


def test_outage_delay_backs_off_from_50_ms_to_one_second() -> None:
    """A fenced write retried on an outage waits 50 ms, doubling up to 1 s, jittered."""
    assert outage_delay(1, 1.0) == pytest.approx(0.05)
    assert outage_delay(6, 1.0) == pytest.approx(1.0)
    assert outage_delay(3, 0.0) == pytest.approx(0.1)  # half the step at the least jitter
    assert outage_delay(3, 0.5) == backoff_delay(3, base=0.05, cap=1.0, jitter=0.5)
