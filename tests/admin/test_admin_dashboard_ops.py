# SPDX-License-Identifier: MIT
"""What the dashboard needs of AsyncAdmin, on every store: key-prefix and error-text
filters, a filtered redrive with a dry-run count, releasing one stale claim, and the
duplicate counts over time (spec §8)."""

from __future__ import annotations

import time
from typing import Any

import pytest

import onceonly
from onceonly._core.admin import BUCKET_SECONDS, Query
from onceonly._core.state import State, Write
from onceonly._runtime import new_token
from onceonly.errors import ConfigurationError


async def _put(store: Any, scope: str, key: str, state: State, **kw: Any) -> None:
    completed = state is State.COMPLETED
    write = Write(state, new_token(), None, kw.pop("attempts", 0), completed=completed, **kw)
    async with store.session() as s:
        assert await s.insert(scope, key, write) is not None


async def test_key_prefix_and_error_filters(async_store: Any) -> None:
    """key_prefix is a literal, case-sensitive prefix; error_contains a literal
    substring in any ASCII case (% and _ are not wildcards)."""
    await _put(async_store, "s", "order-1", State.DEAD, error="Timeout talking to bank")
    await _put(async_store, "s", "order-2", State.DEAD, error="100% refused")
    await _put(async_store, "s", "Order-3", State.DEAD, error="ValueError: bad_amount")
    await _put(async_store, "s", "orders_x", State.FAILED, error="timeout")
    await _put(async_store, "t", "order-9", State.COMPLETED, ttl_seconds=60)
    admin = onceonly.AsyncAdmin(async_store)

    async def keys(**kw: Any) -> list[tuple[str, str]]:
        return [(r.scope, r.key) for r in await admin.list_records(**kw)]

    assert await keys(key_prefix="order-") == [("s", "order-1"), ("s", "order-2"), ("t", "order-9")]
    assert await keys(key_prefix="order_") == []  # _ is no wildcard
    assert await keys(key_prefix="order-", scope="s") == [("s", "order-1"), ("s", "order-2")]
    assert await keys(error_contains="TIMEOUT") == [("s", "order-1"), ("s", "orders_x")]
    assert await keys(error_contains="0%") == [("s", "order-2")]
    assert await keys(error_contains="%") == [("s", "order-2")]
    assert await keys(error_contains="d_a") == [("s", "Order-3")]
    assert await keys(error_contains="timeout", state=State.DEAD) == [("s", "order-1")]
    page = await admin.list_records(key_prefix="order", limit=1, after=("s", "order-1"))
    assert [r.key for r in page] == ["order-2"]


async def test_redrive_matching_counts_then_redrives_only_the_filtered_set(
    async_store: Any,
) -> None:
    """A dry run counts and writes nothing; the redrive then moves exactly those."""
    for i in range(5):
        await _put(async_store, "s", f"k{i}", State.DEAD, attempts=3, error=f"boom {i % 2}")
    await _put(async_store, "s", "other", State.DEAD, attempts=3, error="different")
    await _put(async_store, "s", "done", State.COMPLETED, ttl_seconds=60)
    admin = onceonly.AsyncAdmin(async_store)
    query = Query((State.DEAD,), "s", error_contains="boom 1", limit=1)
    assert await admin.redrive_matching(query, dry_run=True) == 2
    assert len(await admin.list_records(state=State.DEAD)) == 6
    assert await admin.redrive_matching(query) == 2
    failed = await admin.list_records(state=State.FAILED)
    assert [(r.key, r.attempts) for r in failed] == [("k1", 0), ("k3", 0)]
    assert len(await admin.list_records(state=State.DEAD)) == 4
    with pytest.raises(ConfigurationError):
        await admin.redrive_matching(Query((State.COMPLETED,)))
    with pytest.raises(ConfigurationError):
        await admin.redrive_matching(Query())


async def test_redrive_matching_redrives_only_the_set_its_count_saw(async_store: Any) -> None:
    """With ``before`` and ``expect`` (a dry run's): a record that died after the count is
    left alone, and a set that shrank since is not redriven at all."""
    for i in range(3):
        await _put(async_store, "s", f"k{i}", State.DEAD, attempts=3)
    admin = onceonly.AsyncAdmin(async_store)
    query = Query((State.DEAD,), "s", limit=2)
    before = await admin.clock()
    assert await admin.redrive_matching(query, dry_run=True, before=before) == 3
    time.sleep(0.05)
    await _put(async_store, "s", "late", State.DEAD, attempts=3)  # died after the count
    assert await admin.redrive_matching(query, dry_run=True) == 4
    assert await admin.redrive_matching(query, before=before, expect=3) == 3
    dead = await admin.list_records(state=State.DEAD)
    assert [r.key for r in dead] == ["late"]

    for i in range(3):
        await _put(async_store, "t", f"k{i}", State.FAILED, attempts=1)
    query = Query((State.FAILED,), "t")
    before = await admin.clock()
    assert await admin.redrive_matching(query, dry_run=True, before=before) == 3
    assert await admin.delete("t", "k1")  # an operator acted meanwhile
    assert await admin.redrive_matching(query, before=before, expect=3) is None
    left = await admin.list_records(state=State.FAILED, scope="t")
    assert [(r.key, r.attempts) for r in left] == [("k0", 1), ("k2", 1)]  # nothing written
    assert await admin.redrive_matching(query, before=before, expect=2) == 2


def test_sync_redrive_matching_takes_before_and_expect(store: Any) -> None:
    """The sync twin: the same set rules."""
    admin = onceonly.Admin(store)
    with store.session() as s:
        for i in range(2):
            assert s.insert("s", f"k{i}", Write(State.DEAD, new_token(), None, 3)) is not None
    query = Query((State.DEAD,))
    before = admin.clock()
    assert admin.redrive_matching(query, before=before, expect=3) is None
    assert admin.redrive_matching(query, before=before - 3600, expect=0) == 0
    assert admin.redrive_matching(query, before=before, expect=2) == 2


async def test_release_reaps_one_lapsed_claim_only(async_store: Any) -> None:
    """A lapsed claim is released (failed, attempt counted, new token); a live one is not."""
    await _put(async_store, "s", "stale", State.IN_PROGRESS, lease_seconds=-30, attempts=1)
    await _put(async_store, "s", "live", State.IN_PROGRESS, lease_seconds=300)
    await _put(async_store, "s", "dead", State.DEAD, attempts=3)
    admin = onceonly.AsyncAdmin(async_store)
    before = await admin.show("s", "stale")
    released = await admin.release("s", "stale")
    assert released is not None and before is not None
    assert (released.state, released.attempts) == (State.FAILED, 2)
    assert released.token != before.token
    assert await admin.release("s", "live") is None
    assert await admin.release("s", "dead") is None
    assert await admin.release("s", "absent") is None
    live = await admin.show("s", "live")
    assert live is not None and live.state is State.IN_PROGRESS
    assert abs(await admin.clock() - time.time()) < 5  # the store's clock, epoch seconds


async def test_duplicate_history_splits_counts_by_interval(async_store: Any) -> None:
    """Counter buckets land in the interval holding them; older ones are left out."""
    admin = onceonly.AsyncAdmin(async_store)
    now = int(time.time()) // BUCKET_SECONDS * BUCKET_SECONDS
    await admin.records.add_counts(
        [
            ("a", now, 10, 4),
            ("a", now - 120, 5, 1),
            ("b", now - 120, 2, 2),
            ("a", now - 7200, 100, 100),  # outside the window
        ]
    )
    points = await admin.duplicate_history(window=600, points=5)
    assert [p.seconds for p in points] == [120.0] * 5
    assert points[-1].start <= now < points[-1].start + 120
    assert points[-1].counts == {"a": (10, 4)}
    assert points[-2].counts == {"a": (5, 1), "b": (2, 2)}
    assert all(not p.counts or max(c for c, _ in p.counts.values()) < 100 for p in points)
    assert points[-1].rate("a") == 0.4 and points[0].rate("a") is None
    only_b = await admin.duplicate_history(window=600, points=5, scope="b")
    assert only_b[-2].counts == {"b": (2, 2)} and only_b[-1].counts == {}
