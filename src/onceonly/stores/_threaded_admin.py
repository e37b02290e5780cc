# SPDX-License-Identifier: MIT
"""The :class:`~onceonly.types.AsyncAdminStore` side of an async store that wraps a sync
one (SQLite, memory: :class:`~onceonly.stores._threaded.ThreadedAsyncStore`): each call
runs the sync admin side in a worker thread."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from onceonly._core.admin import PurgeRule, Query, ScopeStats
from onceonly._core.state import Expect, Record
from onceonly.types import AdminStore

__all__ = ["ThreadedAdmin"]


class ThreadedAdmin:
    """An async face for a sync :class:`~onceonly.types.AdminStore`.

    .. versionadded:: 0.2
    """

    def __init__(self, sync: AdminStore) -> None:
        self.sync = sync

    async def scan(self, query: Query) -> tuple[list[Record], float]:
        return await asyncio.to_thread(self.sync.scan, query)

    async def count_purgeable(self, rule: PurgeRule) -> int:
        return await asyncio.to_thread(self.sync.count_purgeable, rule)

    async def purge_batch(self, rule: PurgeRule, limit: int) -> int:
        return await asyncio.to_thread(self.sync.purge_batch, rule, limit)

    async def delete(self, scope: str, key: str, expect: Expect) -> bool:
        return await asyncio.to_thread(self.sync.delete, scope, key, expect)

    async def stats(self, scope: str | None = None) -> tuple[list[ScopeStats], float]:
        return await asyncio.to_thread(self.sync.stats, scope)

    async def sizes(self) -> dict[str, int]:
        return await asyncio.to_thread(self.sync.sizes)

    async def add_counts(self, counts: Sequence[tuple[str, int, int, int]]) -> None:
        await asyncio.to_thread(self.sync.add_counts, counts)

    async def read_counts(self, since: float) -> dict[str, tuple[int, int]]:
        return await asyncio.to_thread(self.sync.read_counts, since)

    async def add_lateness(self, rows: Sequence[tuple[str, int, int, int, float | None]]) -> None:
        await asyncio.to_thread(self.sync.add_lateness, rows)

    async def read_lateness(
        self, since: float, step: int
    ) -> list[tuple[str, int, int, int, float | None]]:
        return await asyncio.to_thread(self.sync.read_lateness, since, step)


if TYPE_CHECKING:  # the contract is checked statically
    from onceonly.types import AsyncAdminStore

    _contract: type[AsyncAdminStore] = ThreadedAdmin
