# SPDX-License-Identifier: MIT
"""Retry delays: capped exponential backoff with jitter (randomness passed in)."""

from __future__ import annotations


def backoff_delay(attempts: int, *, base: float, cap: float, jitter: float) -> float:
    """The delay before retry number ``attempts`` (1 = the first retry).

    ``min(cap, base * 2 ** (attempts - 1))`` scaled by a factor in ``[0.5, 1.0]`` taken
    from ``jitter`` (a number in ``[0, 1)``), so relays that failed together do not
    retry together and the delay never falls below half the exponential step.
    """
    if attempts < 1:
        return 0.0
    step = min(cap, base * (2.0 ** min(attempts - 1, 62)))
    return step * (0.5 + 0.5 * min(max(jitter, 0.0), 1.0))
