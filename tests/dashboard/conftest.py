# SPDX-License-Identifier: MIT
"""A seeded async store (SQLite or PostgreSQL) per test, and helpers to write records."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from onceonly._core.state import State, Write
from onceonly._runtime import new_token
from tests.conftest import _async_store

TOKEN = "s3cret-operator-token"


@pytest.fixture(params=["sqlite", "postgres"])
async def dash_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    async for store in _async_store(request.param, tmp_path):
        yield store


async def put(store: Any, scope: str, key: str, state: State, **kw: Any) -> None:
    """Insert ``(scope, key)`` in ``state`` (keywords: Write fields)."""
    completed = state is State.COMPLETED
    attempts = kw.pop("attempts", 0)
    write = Write(state, new_token(), "v1:fp", attempts, completed=completed, **kw)
    async with store.session() as s:
        assert await s.insert(scope, key, write) is not None


async def seed(store: Any) -> None:
    """billing: 3 completed, 2 dead, 1 failed, 1 stale claim; shipping: 2 completed."""
    for i in range(3):
        await put(store, "billing", f"pay-{i}", State.COMPLETED, ttl_seconds=3600, result='"ok"')
    await put(
        store, "billing", "pay-dead-1", State.DEAD, attempts=5,
        error="CardDeclined: insufficient funds", payload='{"amount": 10}',
    )  # fmt: skip
    await put(
        store, "billing", "pay-dead-2", State.DEAD, attempts=5,
        error="TimeoutError: bank did not answer", payload='{"amount": 20}',
    )  # fmt: skip
    await put(store, "billing", "pay-failed", State.FAILED, attempts=2, error="TimeoutError")
    await put(store, "billing", "pay-stuck", State.IN_PROGRESS, lease_seconds=-60)
    for i in range(2):
        await put(store, "shipping", f"ship-{i}", State.COMPLETED, ttl_seconds=3600)
