# SPDX-License-Identifier: MIT
"""Writing records in a chosen state directly through a store's session (for admin tests)."""

from __future__ import annotations

from typing import Any

from onceonly._core.state import Record, State, Write
from onceonly._runtime import new_token


def put(
    store: Any,
    scope: str,
    key: str,
    state: State,
    *,
    ttl: float | None = None,
    lease: float | None = None,
    attempts: int = 0,
    error: str | None = None,
    payload: str | None = None,
) -> Record:
    """Insert ``(scope, key)`` as ``state``; negative ``ttl``/``lease``: already lapsed."""
    completed = state is State.COMPLETED
    write = Write(
        state=state,
        token=new_token(),
        fingerprint="v1:fp",
        attempts=attempts,
        lease_seconds=lease,
        result='"done"' if completed else None,
        error=error,
        payload=payload,
        ttl_seconds=ttl,
        completed=completed,
    )
    with store.session() as s:
        record = s.insert(scope, key, write)
    assert record is not None
    return record


def keys(store: Any) -> set[tuple[str, str]]:
    """Every (scope, key) the store holds."""
    from onceonly._core.admin import Query
    from onceonly.admin import Admin

    return {(r.scope, r.key) for r in Admin(store).iter_records(Query(limit=1000))}
