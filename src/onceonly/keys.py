# SPDX-License-Identifier: MIT
"""Key builders: content hashes, composite keys, time windows, UUIDv7."""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
import uuid

from onceonly._core import keys as _keys
from onceonly._core.keys import composite_key, content_key, validate_key

__all__ = ["composite_key", "content_key", "time_window_key", "uuid7", "validate_key"]


def time_window_key(
    base: str, window: dt.timedelta | float, at: dt.datetime | float | None = None
) -> str:
    """The key of ``base`` within the fixed ``window`` that contains ``at`` (default: now).

    Use it where one effect per window is wanted (a daily digest): every call in the
    same window gets the same key.

    .. versionadded:: 0.1
    """
    width = window.total_seconds() if isinstance(window, dt.timedelta) else float(window)
    if at is None:
        ts = time.time()
    elif isinstance(at, dt.datetime):
        ts = at.timestamp()
    else:
        ts = float(at)
    return _keys.time_window_key(base, width, ts)


class _Uuid7Clock:
    """Milliseconds plus a 12-bit counter, so ids made in one process sort in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ms = 0
        self._counter = 0

    def next(self) -> tuple[int, int]:
        with self._lock:
            ms = time.time_ns() // 1_000_000
            if ms > self._ms:
                self._ms = ms
                self._counter = int.from_bytes(os.urandom(2), "big") & 0x7FF  # room to count
            else:  # same millisecond (or the clock stepped back): count on
                self._counter += 1
                if self._counter > 0xFFF:
                    self._ms += 1
                    self._counter = 0
            return self._ms, self._counter


_uuid7_clock = _Uuid7Clock()


def uuid7() -> str:
    """A new RFC 9562 UUIDv7 as text: a good message id.

    Ids from one process are strictly increasing (a counter in ``rand_a`` orders ids of
    the same millisecond); ids from different processes are ordered by millisecond.

    .. versionadded:: 0.1
    """
    ms, counter = _uuid7_clock.next()
    rand = int.from_bytes(os.urandom(8), "big")
    value = (ms & 0xFFFFFFFFFFFF) << 80
    value |= 0x7 << 76  # version
    value |= counter << 64  # rand_a: 12 bits, the counter
    value |= 0b10 << 62  # variant
    value |= rand & 0x3FFFFFFFFFFFFFFF  # rand_b: 62 bits
    return str(uuid.UUID(int=value))
