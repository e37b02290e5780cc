# SPDX-License-Identifier: MIT
"""AsyncAdmin on every async store (PostgreSQL natively; SQLite and memory in a thread)."""

from __future__ import annotations

from typing import Any

import onceonly
from onceonly._core.admin import Query
from onceonly._core.state import State, Write
from onceonly._runtime import new_token


async def _put(store: Any, key: str, state: State, **kw: Any) -> None:
    completed = state is State.COMPLETED
    write = Write(state, new_token(), None, kw.pop("attempts", 0), completed=completed, **kw)
    async with store.session() as s:
        assert await s.insert("s", key, write) is not None


async def test_async_admin_round(async_store: Any) -> None:
    """Purge, reap, list, redrive, delete and stats through AsyncAdmin."""
    await _put(async_store, "old", State.COMPLETED, ttl_seconds=-60)
    await _put(async_store, "live", State.COMPLETED, ttl_seconds=3600)
    await _put(async_store, "stuck", State.IN_PROGRESS, lease_seconds=-60)
    await _put(async_store, "poison", State.DEAD, attempts=5, error="boom")
    admin = onceonly.AsyncAdmin(async_store)
    assert (await admin.purge(dry_run=True)).deleted == 1
    assert (await admin.purge(pause=0)).deleted == 1
    reaped = await admin.reap(pause=0)
    assert (reaped.reaped, reaped.skipped) == (1, 0)
    stuck = await admin.show("s", "stuck")
    assert stuck is not None and (stuck.state, stuck.attempts) == (State.FAILED, 1)
    assert [r.key for r in await admin.list_records(state=State.DEAD)] == ["poison"]
    assert [r.key async for r in admin.iter_records(Query(limit=1))] == [
        "live",
        "poison",
        "stuck",
    ]
    redriven = await admin.redrive("s", "poison")
    assert redriven is not None and (redriven.state, redriven.attempts) == (State.FAILED, 0)
    assert await admin.redrive_all(state=State.FAILED) == 2
    stats = await admin.stats()
    assert stats.scopes[0].counts[State.FAILED] == 2 and stats.scopes[0].total == 3
    assert await admin.delete("s", "live") is True
    assert await admin.show("s", "live") is None
