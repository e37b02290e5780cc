# SPDX-License-Identifier: MIT
"""AsyncInbox and async @idempotent mirror the sync surfaces over every store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import onceonly


async def test_async_inbox_runs_once(async_store: Any) -> None:
    """AsyncInbox runs the handler once and replays the duplicate."""
    inbox = onceonly.AsyncInbox(async_store, consumer="billing")
    calls: list[Any] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> int:
        calls.append(payload)
        return int(payload["amount"])

    first = await inbox.process("m-1", {"amount": 4}, handler)
    again = await inbox.process("m-1", {"amount": 4}, handler)
    assert (first.result, first.replayed, again.result, again.replayed) == (4, False, 4, True)
    assert len(calls) == 1
    with pytest.raises(onceonly.PayloadMismatch):
        await inbox.process("m-1", {"amount": 5}, handler)


async def test_async_inbox_failure_then_success(async_store: Any) -> None:
    """A failing async handler is recorded and retried as attempt 2."""
    inbox = onceonly.AsyncInbox(async_store, consumer="billing")
    seen: list[int] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> str:
        seen.append(tx.attempt)
        if len(seen) == 1:
            raise RuntimeError("first fails")
        return "ok"

    with pytest.raises(RuntimeError):
        await inbox.process("m-1", {}, handler)
    assert (await inbox.process("m-1", {}, handler)).attempt == 2
    assert seen == [1, 2]


async def test_async_idempotent_concurrent_calls_run_once(leased_async_store: Any) -> None:
    """Ten concurrent calls with one key run the coroutine once and all get its result."""
    calls: list[int] = []

    @onceonly.idempotent(leased_async_store, key=lambda n: f"k{n}", scope="work", lease=5, wait=5)
    async def work(n: int) -> int:
        calls.append(n)
        await asyncio.sleep(0.05)
        return n + 1

    results = await asyncio.gather(*(work(1) for _ in range(10)))
    assert results == [2] * 10
    assert calls == [1]


async def test_async_checkpoint(leased_async_store: Any) -> None:
    """current_async_claim().checkpoint() saves a recovery point under the claim."""

    @onceonly.idempotent(leased_async_store, key=lambda: "k", scope="work", lease=5)
    async def work() -> dict[str, Any]:
        claim = onceonly.current_async_claim()
        await claim.checkpoint("step1", {"x": 1})
        return dict(claim.checkpoints)

    assert await work() == {"step1": {"x": 1}}


async def test_async_function_needs_async_store(tmp_path: Any) -> None:
    """An async function with a sync store is a ConfigurationError."""
    store = onceonly.open_store(f"sqlite:///{tmp_path / 's.db'}")
    with pytest.raises(onceonly.ConfigurationError):

        @onceonly.idempotent(store, key=lambda: "k")
        async def f() -> None:
            return None
