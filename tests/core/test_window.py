# SPDX-License-Identifier: MIT
"""The dedup window against the redelivery horizon (onceonly._core.window)."""

from __future__ import annotations

import logging
import math

import pytest

from onceonly._core.window import Bound, check_policy, enforce, horizon, uncovered
from onceonly.errors import ConfigurationError

LOG = logging.getLogger("test.window")


def test_the_latest_bound_is_the_horizon() -> None:
    bounds = [Bound("max_age", 3600), Bound("deliveries", 300)]
    assert horizon(bounds) == Bound("max_age", 3600)
    assert horizon([*bounds, Bound("x", math.inf)]) == Bound("x", math.inf)
    assert horizon([]) is None


@pytest.mark.parametrize(
    ("ttl", "bounds", "covered"),
    [
        (600.0, [Bound("a", 300)], True),
        (300.0, [Bound("a", 300)], True),
        (299.0, [Bound("a", 300)], False),
        (None, [Bound("a", math.inf)], True),  # a ttl of None remembers for ever
        (10.0, [], True),  # nothing known: nothing to say
        (10.0, [Bound("a", math.inf)], False),
        (10.0, [Bound("a", 5), Bound("b", 20)], False),  # every bound must be covered
    ],
)
def test_uncovered(ttl: float | None, bounds: list[Bound], covered: bool) -> None:
    problem = uncovered(ttl, bounds)
    assert (problem is None) == covered
    if problem is not None:
        assert "redelivery horizon" in problem


def test_policies(caplog: pytest.LogCaptureFixture) -> None:
    bounds = [Bound("stream max_age", 3600)]
    with pytest.raises(ConfigurationError, match="stream max_age: 3600 s"):
        enforce("refuse", 60.0, bounds, LOG, "here")
    with caplog.at_level(logging.WARNING, logger="test.window"):
        enforce("warn", 60.0, bounds, LOG, "here")
        enforce("off", 60.0, bounds, LOG, "here")
        enforce("refuse", 7200.0, bounds, LOG, "here")
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["here"]
    with pytest.raises(ConfigurationError, match="dedup_window"):
        check_policy("loud")
