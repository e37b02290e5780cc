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


def outage_delay(tries: int, jitter: float) -> float:
    """The pause after try number ``tries`` of a fenced write (a claim, the final write of
    a run) failed on an unavailable store: from 50 ms, doubling up to 1 s (jittered).

    Such a write is conditional on its token, so repeating it cannot overwrite anyone.
    """
    return backoff_delay(tries, base=0.05, cap=1.0, jitter=jitter)


def in_flight_delay(waits: int, retry_after: float | None, remaining: float) -> float:
    """The pause before look number ``waits + 1`` at a key another worker holds.

    From 10 ms, doubling up to 0.5 s: a short run elsewhere is seen finished soon, a long
    one is not polled hard. Never longer than the holder's lease has to run
    (``retry_after``, when known: it may lapse and be taken over then) nor than the
    caller still waits (``remaining``).
    """
    step = backoff_delay(waits, base=0.01, cap=0.5, jitter=1.0)
    return min(step, remaining, retry_after or step)
