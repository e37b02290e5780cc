# SPDX-License-Identifier: MIT
"""Key builders: content hashes, composite keys, time windows, UUIDv7."""

from __future__ import annotations

import datetime as dt
import os
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


def uuid7() -> str:
    """A new RFC 9562 UUIDv7 (time-ordered) as text: a good message id.

    .. versionadded:: 0.1
    """
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & 0xFFFFFFFFFFFF) << 80
    value |= 0x7 << 76  # version
    value |= ((rand >> 62) & 0xFFF) << 64  # rand_a: 12 bits
    value |= 0b10 << 62  # variant
    value |= rand & 0x3FFFFFFFFFFFFFFF  # rand_b: 62 bits
    return str(uuid.UUID(int=value))
