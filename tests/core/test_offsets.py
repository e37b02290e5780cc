# SPDX-License-Identifier: MIT
"""The partition rules of a log consumer (onceonly._core.offsets, docs/spec.md §4.9)."""

from __future__ import annotations

from onceonly._core.offsets import PartitionOrder


def taken(p: PartitionOrder[str], limit: int = 10, now: float = 0.0) -> list[int]:
    return [s.offset for s in p.take(limit, now)]


def test_one_key_runs_in_offset_order_other_keys_alongside() -> None:
    """Offsets 0 and 2 share a key: 2 waits until 0 is settled; 1 and 3 run at once."""
    p: PartitionOrder[str] = PartitionOrder(next=0)
    for offset, key in enumerate([b"a", b"b", b"a", None]):
        assert p.add(offset, key, f"r{offset}")
    assert taken(p) == [0, 1, 3]
    assert taken(p) == []
    p.settle(0)
    assert taken(p) == [2]


def test_records_without_a_key_are_unordered() -> None:
    p: PartitionOrder[str] = PartitionOrder(next=0)
    for offset in range(3):
        p.add(offset, None, "r")
    assert taken(p) == [0, 1, 2]


def test_the_watermark_stops_at_the_first_unsettled_record() -> None:
    """Settled out of order: the watermark moves only past a settled prefix; ``but``
    counts one record as settled (the position its own transaction may write)."""
    p: PartitionOrder[str] = PartitionOrder(next=5)
    for offset in (5, 6, 7):
        p.add(offset, bytes([offset]), "r")
    taken(p)
    p.settle(6)
    assert p.watermark() == 5
    assert p.watermark(but=5) == 7
    assert p.watermark(but=7) == 5
    assert p.watermark(but={5, 7}) == 8
    assert p.watermark(but=[7, 6]) == 5
    p.settle(5)
    assert p.watermark() == 7
    p.settle(7)
    assert p.watermark() == 8


def test_a_handed_back_record_waits_at_its_place() -> None:
    """A retried record runs again after its delay; its key's later record waits behind
    it; the watermark stays below it."""
    p: PartitionOrder[str] = PartitionOrder(next=0)
    p.add(0, b"a", "r0")
    p.add(1, b"a", "r1")
    p.add(2, b"b", "r2")
    assert taken(p) == [0, 2]
    p.hand_back(0, not_before=5.0)
    p.settle(2)
    assert taken(p, now=1.0) == []
    assert p.watermark() == 0
    assert p.next_wake() == 5.0
    [slot] = p.take(10, now=5.0)
    assert (slot.offset, slot.deliveries) == (0, 2)


def test_a_lost_partition_hands_out_nothing_and_records_before_next_are_ignored() -> None:
    p: PartitionOrder[str] = PartitionOrder(next=3)
    assert not p.add(2, b"a", "old")
    assert p.add(3, b"a", "r3")
    p.lost = True
    assert taken(p) == []
    assert p.watermark() == 3


def test_take_below_leaves_later_records_free_to_run() -> None:
    """``below``: only records at lower offsets are handed out; the others stay free and
    ``first_free`` names the lowest of them (a consumer's handed mark in the store must
    pass it before it goes out)."""
    p: PartitionOrder[str] = PartitionOrder(next=0)
    for offset in range(6):
        p.add(offset, bytes([offset]), f"r{offset}")
    assert p.first_free(0.0) == 0
    assert [s.offset for s in p.take(10, 0.0, below=3)] == [0, 1, 2]
    assert p.first_free(0.0) == 3
    assert [s.offset for s in p.take(10, 0.0, below=3)] == []
    assert [s.offset for s in p.take(2, 0.0, below=10)] == [3, 4]
    assert p.first_free(0.0) == 5


def test_first_free_skips_what_is_out_or_waiting() -> None:
    """A record handed out, or handed back and still waiting, is not free; a waiting one
    is free again once its delay is over."""
    p: PartitionOrder[str] = PartitionOrder(next=0)
    p.add(0, b"a", "r0")
    p.add(1, b"a", "r1")
    p.add(2, b"b", "r2")
    assert taken(p) == [0, 2]
    assert p.first_free(0.0) is None
    p.hand_back(0, not_before=5.0)
    assert p.first_free(1.0) is None
    assert p.first_free(5.0) == 0
    assert [s.offset for s in p.take(10, 5.0, below=1)] == [0]
