# SPDX-License-Identifier: MIT
"""The in-process tier of :class:`~onceonly.stores.tiered._store.TieredStore` and the rules every
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
* A fill never undoes an invalidation: each tier has a generation that an invalidation
  bumps (the local tier one per tier, the Redis tier one per key), read **before** the
  durable store is asked; a fill carries the generation it read and is dropped when the
  tier's has moved on (:class:`Seen`).
* A sick Redis tier costs milliseconds: short timeouts, and a :class:`CircuitBreaker`
  that stops asking it after a few failures in a row and probes again after a cool-down.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from onceonly._core.state import Record, State, replays
from onceonly.errors import ConfigurationError

__all__ = [
    "CircuitBreaker",
    "Clock",
    "LocalTier",
    "Seen",
    "cacheable",
    "decode_record",
    "encode_record",
    "usable",
]

log = logging.getLogger("onceonly.tiers")

_Key = tuple[str, str]

#: Seconds a Redis generation key lives after its last bump (an invalidation).
GENERATION_TTL = 86_400.0
#: A fill whose generation was read longer ago than this is dropped (not cached): the
#: generation key it was compared with may have expired meanwhile. Well below
#: :data:`GENERATION_TTL`, so a fill is never compared with a generation that lapsed.
MAX_FILL_AGE = 3_600.0


def cacheable(record: Record | None) -> bool:
    """Whether a tier may keep ``record``: completed (a result or a cached error)."""
    return record is not None and record.state is State.COMPLETED


def usable(record: Record, fingerprint: str | None, now: float) -> bool:
    """Whether a cached ``record`` may answer a delivery with ``fingerprint`` at ``now``
    (the durable store's clock): the claim's decision would replay it (completed,
    unexpired, no mismatch: :func:`~onceonly._core.state.replays`) and the fingerprint
    is the same (one made under another scheme goes to the durable store)."""
    return replays(record, now, fingerprint) and (
        fingerprint is None or record.fingerprint is None or record.fingerprint == fingerprint
    )


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


@dataclasses.dataclass(frozen=True)
class Seen:
    """What a claim saw of the tiers **before** it asked the durable store: the only
    generations a fill of what the durable store answered may be compared with.

    Attributes:
        local: the local tier's generation (``None``: no local tier).
        redis: the key's generation in Redis (``None``: unknown, so nothing is written to
            Redis: no Redis tier, a failure, or an open breaker).
        at: ``time.monotonic()`` when they were read.
    """

    local: int | None
    redis: int | None
    at: float

    def fresh(self) -> bool:
        """Whether a fill may still rely on these generations (:data:`MAX_FILL_AGE`)."""
        return time.monotonic() - self.at < MAX_FILL_AGE


class CircuitBreaker:
    """Stops asking a sick tier: **closed** (ask), **open** after ``failures`` failures
    in a row (do not ask) for ``cooldown`` seconds, then **half-open**: one caller
    probes, the others still do not ask; the probe's success closes it, its failure
    opens it again for another ``cooldown``. Thread-safe.

    Args:
        failures: failures in a row that open it.
        cooldown: seconds it stays open before a probe.
        clock: monotonic seconds (for tests).

    Raises:
        ConfigurationError: ``failures`` below 1 or a ``cooldown`` that is not positive.

    .. versionadded:: 0.3
    """

    def __init__(
        self,
        failures: int = 3,
        cooldown: float = 5.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        name: str = "tier",
    ) -> None:
        if not isinstance(failures, int) or failures < 1:
            raise ConfigurationError("the breaker's failures must be a positive int")
        if not cooldown > 0:
            raise ConfigurationError("the breaker's cooldown must be positive")
        self.failures = failures
        self.cooldown = float(cooldown)
        self.name = name
        self._clock = clock
        self._lock = threading.Lock()
        self._count = 0
        self._open_until: float | None = None  # None: closed
        self._probing = False
        self.opened = 0  # how many times it opened (for metrics and tests)

    @property
    def state(self) -> str:
        """``"closed"``, ``"open"`` or ``"half-open"`` (a probe is under way)."""
        with self._lock:
            if self._open_until is None:
                return "closed"
            return "half-open" if self._probing else "open"

    def allow(self) -> bool:
        """Whether to ask the tier now (``True`` for the one probe when half-open)."""
        with self._lock:
            if self._open_until is None:
                return True
            if self._probing or self._clock() < self._open_until:
                return False
            self._probing = True
            return True

    def success(self) -> None:
        """The tier answered: closed, failure count reset."""
        with self._lock:
            if self._open_until is not None:
                log.info("%s answers again: breaker closed", self.name)
            self._count, self._open_until, self._probing = 0, None, False

    def failure(self) -> None:
        """The tier failed: counted; opens the breaker at ``failures`` in a row (or when
        the probe failed)."""
        with self._lock:
            self._count += 1
            if self._probing or (self._open_until is None and self._count >= self.failures):
                if not self._probing:
                    self.opened += 1
                    log.warning(
                        "%s failed %d times in a row: not asked for %gs",
                        self.name,
                        self._count,
                        self.cooldown,
                    )
                self._open_until = self._clock() + self.cooldown
                self._probing = False

    def __repr__(self) -> str:
        return f"CircuitBreaker(failures={self.failures}, cooldown={self.cooldown:g})"


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
        self._generation = 0  # bumped by every invalidation
        self._durable: Any = None  # the one durable store whose records it holds

    def bind(self, durable: object) -> None:
        """Serve ``durable``'s records only (keys carry no store identity here).

        Raises:
            ConfigurationError: it already serves another durable store.
        """
        with self._lock:
            if self._durable is not None and self._durable is not durable:
                raise ConfigurationError(
                    "this LocalTier already serves another durable store: give each "
                    "TieredStore over a different store a LocalTier of its own"
                )
            self._durable = durable

    @property
    def generation(self) -> int:
        """Bumped by every :meth:`invalidate`; read before asking the durable store."""
        return self._generation

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

    def replay(self, scope: str, key: str, fingerprint: str | None, now: float) -> Record | None:
        """The record kept for ``(scope, key)`` if it may answer a claim with
        ``fingerprint`` at ``now`` (:func:`usable`); one that may not is forgotten.

        Builds nothing: the record returned is the one kept.
        """
        k = (scope, key)
        with self._lock:
            entry = self._entries.get(k)
            if entry is None:
                return None
            record = entry.record
            if entry.until <= time.monotonic() or not usable(record, fingerprint, now):
                del self._entries[k]
                return None
            self._entries.move_to_end(k)
            return record

    def put(self, record: Record, generation: int | None = None) -> bool:
        """Keep ``record`` (a completed one; others are ignored).

        Args:
            record: the record.
            generation: :attr:`generation` as read before the durable store answered
                with ``record``; when an invalidation came since, nothing is kept.

        Returns:
            Whether it was kept.
        """
        if not cacheable(record):
            return False
        k = (record.scope, record.key)
        with self._lock:
            if generation is not None and generation != self._generation:
                return False  # an operator changed a record since: this one may be gone
            self._entries[k] = _Entry(record, time.monotonic() + self.ttl)
            self._entries.move_to_end(k)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
            return True

    def drop(self, scope: str, key: str) -> None:
        """Forget ``(scope, key)`` (a worker's write, followed by its own fill)."""
        with self._lock:
            self._entries.pop((scope, key), None)

    def invalidate(self, scope: str, key: str) -> None:
        """Forget ``(scope, key)`` and refuse every fill that read the durable store
        before now (an operator deleted or rewrote the record)."""
        with self._lock:
            self._generation += 1
            self._entries.pop((scope, key), None)

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"LocalTier(size={self.size}, ttl={self.ttl:g})"
