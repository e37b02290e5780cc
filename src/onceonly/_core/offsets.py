# SPDX-License-Identifier: MIT
"""One partition of a log (Kafka) from receipt to settlement: which records may run
now, and the offset a consumer may commit (docs/spec.md §4.9).

Rules (pure: no I/O, no clock reads; the caller passes ``now``):

* **Order by key.** A record may be handed out only when every earlier unsettled
  record of its partition has another key: records with one key run in offset order,
  records with different keys at once. Records without a key (``None``) are not
  ordered among themselves (the caller passes one key for all of a partition's
  records to run them in offset order).
* **Retries stay in place.** A record handed back waits (``not_before``) at its place:
  later records with its key wait behind it, the others go on.
* **The watermark.** The offset to commit is the lowest offset received and not
  settled, or, when every record received is settled, the offset after the last one.
  Every record before the watermark is settled; nothing at or after it is assumed.
  :meth:`PartitionOrder.watermark` can leave out records (``but=``): the position a
  transaction that settles those records (one, or a batch's) may write.
* **Lost.** A partition taken away (a rebalance) hands out nothing more; what it
  still holds keeps the watermark where it is.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["PartitionOrder", "Slot"]

R = TypeVar("R")


@dataclass
class Slot(Generic[R]):
    """One record received and not settled."""

    offset: int
    key: bytes | None
    record: R
    out: bool = False  # handed out, not yet settled or handed back
    not_before: float = 0.0  # handed back: may run again from this time
    deliveries: int = 0  # times handed out by this consumer
    wrote: int = -1  # the position its transaction wrote (committed once it is settled)


@dataclass
class PartitionOrder(Generic[R]):
    """The records of one partition between receipt and settlement.

    Attributes:
        next: the offset after the last record received (where reading goes on).
        stored: the highest position known to be committed (store or broker).
        lost: the partition was taken away: nothing more is handed out.
    """

    next: int
    stored: int = -1
    lost: bool = False
    _slots: dict[int, Slot[R]] = field(default_factory=dict)
    _order: deque[int] = field(default_factory=deque)  # unsettled offsets, ascending
    _keys: dict[object, deque[int]] = field(default_factory=dict)
    _ready: list[int] = field(default_factory=list)  # heap: key heads free to run
    _waiting: list[tuple[float, int]] = field(default_factory=list)  # heap: handed back

    def __len__(self) -> int:
        return len(self._slots)

    def add(self, offset: int, key: bytes | None, record: R) -> bool:
        """Take a received record; ``False`` (ignored) when it is not past :attr:`next`."""
        if offset < self.next or self.lost:
            return False
        self.next = offset + 1
        self._slots[offset] = Slot(offset, key, record)
        self._order.append(offset)
        queue = self._keys.setdefault(_order_key(key, offset), deque())
        queue.append(offset)
        if len(queue) == 1:
            heapq.heappush(self._ready, offset)
        return True

    def take(self, limit: int, now: float, below: int | None = None) -> list[Slot[R]]:
        """Up to ``limit`` records free to run, lowest offsets first; marks them out.
        ``below``: only records at lower offsets (the others stay free to run)."""
        if self.lost:
            return []
        self._wake(now)
        out: list[Slot[R]] = []
        while self._ready and len(out) < limit:
            if below is not None and self._ready[0] >= below:
                break  # the heap's head is its lowest offset: nothing else is below
            offset = heapq.heappop(self._ready)
            slot = self._slots.get(offset)
            if slot is None or slot.out or slot.not_before > now:
                continue
            slot.out = True
            slot.deliveries += 1
            out.append(slot)
        return out

    def first_free(self, now: float) -> int | None:
        """The lowest offset :meth:`take` would hand out at ``now`` (``None``: none)."""
        if self.lost:
            return None
        self._wake(now)
        while self._ready:
            slot = self._slots.get(self._ready[0])
            if slot is not None and not slot.out and slot.not_before <= now:
                return slot.offset
            heapq.heappop(self._ready)  # stale, as take() would find it
        return None

    def _wake(self, now: float) -> None:
        """Handed-back records whose delay is over are free to run again."""
        while self._waiting and self._waiting[0][0] <= now:
            _, offset = heapq.heappop(self._waiting)
            slot = self._slots.get(offset)
            if slot is not None and not slot.out:
                heapq.heappush(self._ready, offset)

    def next_wake(self) -> float | None:
        """When the earliest handed-back record may run again (``None``: none waits)."""
        return self._waiting[0][0] if self._waiting else None

    def slot(self, offset: int) -> Slot[R] | None:
        """The unsettled record at ``offset``, if any."""
        return self._slots.get(offset)

    def slots(self) -> list[Slot[R]]:
        """Every record received and not settled."""
        return list(self._slots.values())

    def hand_back(self, offset: int, not_before: float) -> None:
        """A record handed out comes back, to run again from ``not_before``."""
        slot = self._slots.get(offset)
        if slot is None or not slot.out:
            return
        slot.out = False
        slot.not_before = not_before
        heapq.heappush(self._waiting, (not_before, offset))

    def settle(self, offset: int) -> None:
        """A record is settled (acked or dead-lettered): its key's next record may run."""
        slot = self._slots.pop(offset, None)
        if slot is None:
            return
        self.stored = max(self.stored, slot.wrote)
        key = _order_key(slot.key, offset)
        queue = self._keys[key]
        queue.remove(offset)  # the head, unless settled out of order (never by the rules)
        if queue:
            heapq.heappush(self._ready, queue[0])
        else:
            del self._keys[key]
        while self._order and self._order[0] not in self._slots:
            self._order.popleft()

    def watermark(self, but: int | Collection[int] = ()) -> int:
        """Every record before the returned offset is settled (``but``: as if that
        offset, or those offsets, were settled too)."""
        skip = (but,) if isinstance(but, int) else but
        for offset in self._order:
            if offset in self._slots and offset not in skip:
                return offset
        return self.next

    def in_flight(self) -> int:
        """Records handed out and not yet settled or handed back."""
        return sum(1 for s in self._slots.values() if s.out)


def _order_key(key: bytes | None, offset: int) -> object:
    """Records without a key are each their own key (unordered among themselves)."""
    return key if key is not None else ("no key", offset)
