# SPDX-License-Identifier: MIT
"""The in-process tier of :class:`~onceonly.stores.tiered.TieredStore` and the rules every
tier follows (no I/O).

Rules (docs/stores.md, "Cache tiers"):

* Only **terminal, validated** records are cached: ``completed`` ones (a result or a
  cached error), read from or written to the durable store **after** their transaction
  committed. Never ``in_progress``/``failed``/``dead``, never an absence.
* A cached record is used only if it has not expired on the durable store's clock (as
  estimated here from the last answer of the durable store) and its fingerprint is the
  incoming one; anything else goes to the durable store, which decides.
* Each tier bounds how long it keeps a record (its ``ttl``), so a record deleted where
  no tier hears of it (another process, the CLI) replays from a tier for at most that.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import OrderedDict

from onceonly._core.state import Record, State
from onceonly.errors import ConfigurationError

__all__ = ["Clock", "LocalTier", "cacheable", "decode_record", "encode_record", "usable"]

_Key = tuple[str, str]


def cacheable(record: Record | None) -> bool:
    """Whether a tier may keep ``record``: completed (a result or a cached error)."""
    return record is not None and record.state is State.COMPLETED


def usable(record: Record, fingerprint: str | None, now: float) -> bool:
    """Whether a cached ``record`` may answer a delivery with ``fingerprint`` at ``now``
    (the durable store's clock): still completed, unexpired, the same fingerprint."""
    if record.state is not State.COMPLETED:
        return False
    if record.expires_at is not None and record.expires_at <= now:
        return False
    return fingerprint is None or record.fingerprint is None or record.fingerprint == fingerprint


def encode_record(record: Record) -> str:
    """``record`` as JSON text (for the Redis tier)."""
    data = dataclasses.asdict(record)
    data["state"] = record.state.value
    return json.dumps(data, separators=(",", ":"))


def decode_record(text: str | bytes) -> Record | None:
    """The record of :func:`encode_record`'s text; ``None`` for anything else."""
    try:
        data = json.loads(text)
        data["state"] = State(data["state"])
        return Record(**data)
    except (ValueError, TypeError, KeyError):
        return None


class Clock:
    """This process's estimate of the durable store's clock: the local clock plus the
    offset seen in the durable store's last answer."""

    def __init__(self) -> None:
        self.offset = 0.0

    def saw(self, store_now: float) -> None:
        """The durable store answered with its ``now``."""
        self.offset = store_now - time.time()

    def now(self) -> float:
        return time.time() + self.offset


@dataclasses.dataclass
class _Entry:
    record: Record
    until: float  # monotonic deadline of this entry (the tier's ttl)


class LocalTier:
    """An LRU of completed records in this process: a replay it answers costs no round
    trip.

    Args:
        size: how many records it keeps (the least recently used go first).
        ttl: seconds a record is kept at most, whatever its own expiry: the bound on how
            long a record deleted elsewhere may still replay here.

    Raises:
        ConfigurationError: a size below 1 or a ttl that is not positive.

    .. versionadded:: 0.3
    """

    def __init__(self, size: int = 10_000, ttl: float = 60.0) -> None:
        if not isinstance(size, int) or size < 1:
            raise ConfigurationError("the local tier's size must be a positive int")
        if not ttl > 0:
            raise ConfigurationError("the local tier's ttl must be positive")
        self.size = size
        self.ttl = float(ttl)
        self._entries: OrderedDict[_Key, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, scope: str, key: str) -> Record | None:
        """The record kept for ``(scope, key)``, if its tier ttl has not run out."""
        k = (scope, key)
        with self._lock:
            entry = self._entries.get(k)
            if entry is None:
                return None
            if entry.until <= time.monotonic():
                del self._entries[k]
                return None
            self._entries.move_to_end(k)
            return entry.record

    def put(self, record: Record) -> None:
        """Keep ``record`` (a completed one; others are ignored)."""
        if not cacheable(record):
            return
        k = (record.scope, record.key)
        with self._lock:
            self._entries[k] = _Entry(record, time.monotonic() + self.ttl)
            self._entries.move_to_end(k)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def drop(self, scope: str, key: str) -> None:
        """Forget ``(scope, key)``."""
        with self._lock:
            self._entries.pop((scope, key), None)

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"LocalTier(size={self.size}, ttl={self.ttl:g})"
