# SPDX-License-Identifier: MIT
"""The dedup window against the broker's redelivery horizon (pure; no I/O).

An inbox remembers a completed key for its ``ttl``. A broker may redeliver a message
until its **redelivery horizon**: the largest of the bounds known (a stream's
``max_age`` or a queue's message TTL — a message kept that long may be redelivered that
late when consumers were down; the number of deliveries times the wait between them —
while consumers run). Each bound is a way a redelivery can come late, so the ttl must
cover every one (the same rule as ``onceonly doctor``). Consumers check this at start
(``dedup_window="warn" | "refuse" | "off"``) when they can read the bounds;
``onceonly doctor`` checks it from outside.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from onceonly.errors import ConfigurationError

__all__ = ["POLICIES", "Bound", "check_policy", "enforce", "horizon", "uncovered"]

POLICIES = ("warn", "refuse", "off")


@dataclass(frozen=True)
class Bound:
    """One limit on how long after its first delivery a message can come again
    (``seconds``: ``math.inf`` when the broker sets none)."""

    name: str
    seconds: float


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ConfigurationError(
            f"dedup_window must be one of {', '.join(map(repr, POLICIES))}, not {policy!r}"
        )
    return policy


def horizon(bounds: Sequence[Bound]) -> Bound | None:
    """The latest a redelivery can come: the largest bound."""
    return max(bounds, key=lambda b: b.seconds, default=None)


def uncovered(ttl: float | None, bounds: Sequence[Bound]) -> str | None:
    """Why ``ttl`` does not cover the horizon of ``bounds`` (``None``: it does, or no
    bound is known)."""
    binding = horizon(bounds)
    if ttl is None or binding is None or ttl >= binding.seconds:
        return None
    shown = "unlimited" if math.isinf(binding.seconds) else f"{binding.seconds:g} s"
    return (
        f"the inbox ttl ({ttl:g} s) is shorter than the redelivery horizon ({binding.name}:"
        f" {shown}): a redelivery after the ttl runs the handler again; raise the ttl or"
        " bound the redeliveries"
    )


def enforce(
    policy: str, ttl: float | None, bounds: Sequence[Bound], log: logging.Logger, where: str
) -> None:
    """Apply ``policy`` at a consumer's start: log a warning, or raise
    :class:`ConfigurationError` (``refuse``), when ``ttl`` does not cover the horizon."""
    if policy == "off":
        return
    problem = uncovered(ttl, bounds)
    if problem is None:
        return
    if policy == "refuse":
        raise ConfigurationError(f"{where}: {problem} (dedup_window='refuse')")
    log.warning("%s: %s", where, problem)
