# SPDX-License-Identifier: MIT
"""Durations given as options: seconds, a ``timedelta`` or ``None``, checked once."""

from __future__ import annotations

import datetime as dt

from onceonly.errors import ConfigurationError

__all__ = ["MAX_SECONDS", "seconds"]

# The longest duration a store can hold as a lease or ttl (about 100 years): PostgreSQL's
# timestamps end in 294276 AD, but a "forever" is spelled None, not timedelta.max.
MAX_SECONDS = 100 * 366 * 86400.0


def seconds(
    value: float | dt.timedelta | None,
    *,
    what: str,
    allow_none: bool = False,
    allow_inf: bool = False,
    allow_zero: bool = False,
) -> float:
    """``value`` in seconds; :class:`ConfigurationError` unless positive and storable.

    Durations past :data:`MAX_SECONDS` are refused (use ``None`` for "for ever" where the
    option allows it); with ``allow_inf``, ``float("inf")`` means "no limit" (waits);
    with ``allow_zero``, 0 is accepted too (a wait of 0: answer at once).
    """
    if value is None:
        if allow_none:
            return float("inf")
        raise ConfigurationError(f"{what} is required")
    if isinstance(value, (bool, str, bytes)):
        raise ConfigurationError(f"{what} must be a number of seconds, not {value!r}")
    try:
        out = value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigurationError(f"{what} must be a number of seconds, not {value!r}") from None
    if allow_zero and out == 0:
        return 0.0
    if not out > 0:
        raise ConfigurationError(
            f"{what} must be {'zero or ' if allow_zero else ''}positive, not {value!r}"
        )
    if out > MAX_SECONDS and allow_inf:
        return float("inf")  # a wait that long is no limit
    if out > MAX_SECONDS:
        raise ConfigurationError(
            f"{what} must be at most {MAX_SECONDS:.0f} seconds (about 100 years), not "
            f"{value!r}" + ("; use None to keep it for ever" if what == "ttl" else "")
        )
    return out
