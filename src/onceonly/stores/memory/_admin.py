# SPDX-License-Identifier: MIT
"""Operator access to a :class:`~onceonly.stores.memory._store.MemoryStore` (the
:class:`~onceonly.types.AdminStore` contract): the ``_core.admin`` predicates applied
under the store's lock. A key held by an open transaction is skipped, like a row lock
that ``SKIP LOCKED`` skips."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from onceonly._core.admin import PurgeRule, Query, ScopeStats, purge_qualifies
from onceonly._core.lateness import max_ttl, sum_lateness
from onceonly._core.state import Expect, Record, State, is_expired

if TYPE_CHECKING:
    from onceonly.stores.memory._store import MemoryStore

__all__ = ["MemoryAdmin"]


class MemoryAdmin:
    """The admin side of a memory store.

    .. versionadded:: 0.2
    """

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    def scan(self, query: Query) -> tuple[list[Record], float]:
        store = self.store
        with store._lock:
            now = store.clock()
            found = sorted(
                (r for r in store._records.values() if query.matches(r, now)),
                key=lambda r: (r.scope, r.key),
            )
        return found[: query.limit], now

    def count_purgeable(self, rule: PurgeRule) -> int:
        store = self.store
        with store._lock:
            now = store.clock()
            return sum(1 for r in store._records.values() if purge_qualifies(r, now, rule))

    def purge_batch(self, rule: PurgeRule, limit: int) -> int:
        store = self.store
        deleted = 0
        with store._lock:
            now = store.clock()
            for k, record in list(store._records.items()):
                if deleted >= limit:
                    break
                lock = store._key_locks.get(k)
                if lock is not None and lock.locked():  # held by a transaction: skip it
                    continue
                if purge_qualifies(record, now, rule):
                    del store._records[k]
                    deleted += 1
        return deleted

    def delete(self, scope: str, key: str, expect: Expect) -> bool:
        store = self.store
        with store._lock:
            record = store._records.get((scope, key))
            if not expect.matches(record, store.clock()):
                return False
            del store._records[(scope, key)]
            return True

    def stats(self, scope: str | None = None) -> tuple[list[ScopeStats], float]:
        store = self.store
        with store._lock:
            now = store.clock()
            records = [r for r in store._records.values() if scope is None or r.scope == scope]
        by_scope: dict[str, list[Record]] = {}
        for r in records:
            by_scope.setdefault(r.scope, []).append(r)
        out = []
        for name in sorted(by_scope):
            rows = by_scope[name]
            counts = {s: sum(1 for r in rows if r.state is s) for s in State}
            started = [r.created_at for r in rows if r.state is State.IN_PROGRESS]
            out.append(
                ScopeStats(
                    name,
                    counts,
                    oldest_in_progress=now - min(started) if started else None,
                    expired=sum(1 for r in rows if is_expired(r, now)),
                )
            )
        return out, now

    def sizes(self) -> dict[str, int]:
        return {}

    def add_counts(self, counts: Sequence[tuple[str, int, int, int]]) -> None:
        with self.store._lock:
            for scope, bucket, claims, replays in counts:
                row = self.store._counts.setdefault((scope, bucket), [0, 0])
                row[0] += claims
                row[1] += replays

    def read_counts(self, since: float) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        with self.store._lock:
            for (scope, bucket), (claims, replays) in self.store._counts.items():
                if bucket >= since:
                    c, r = out.get(scope, (0, 0))
                    out[scope] = (c + claims, r + replays)
        return out

    def add_lateness(self, rows: Sequence[tuple[str, int, int, int, float | None]]) -> None:
        with self.store._lock:
            for scope, bucket, b, n, ttl in rows:
                row = self.store._lateness.setdefault((scope, bucket, b), [0, None])
                row[0] += n
                row[1] = max_ttl(row[1], ttl)

    def read_lateness(
        self, since: float, step: int
    ) -> list[tuple[str, int, int, int, float | None]]:
        with self.store._lock:
            rows = [(s, t, b, n, ttl) for (s, t, b), (n, ttl) in self.store._lateness.items()]
        return sum_lateness(rows, since, step)


if TYPE_CHECKING:  # the contract is checked statically
    from onceonly.types import AdminStore

    _contract: type[AdminStore] = MemoryAdmin
