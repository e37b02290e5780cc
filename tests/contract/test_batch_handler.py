# SPDX-License-Identifier: MIT
"""``process_batch(items, batch_handler=...)`` over every store (docs/spec.md §1.6a): the
new messages go to the batch handler (together on PostgreSQL, one at a time on stores
that claim key by key), replays do not, outcomes keep the order given."""

from __future__ import annotations

from typing import Any

import pytest

import onceonly


def test_a_batch_handler_sees_only_new_messages(store: Any) -> None:
    inbox = onceonly.Inbox(store, "billing", max_attempts=2)
    calls: list[list[tuple[str, int]]] = []

    def handle(messages: list[onceonly.BatchMessage], tx: onceonly.Tx) -> list[Any]:
        calls.append([(m.key, m.attempt) for m in messages])
        if any(m.payload.get("boom") for m in messages):
            raise RuntimeError("boom")
        return [m.payload["n"] * 10 for m in messages]

    batch = [("b", {"n": 2}), ("a", {"n": 1}), ("a", {"n": 1})]
    out = inbox.process_batch(batch, batch_handler=handle)
    assert [(o.key, o.result, o.replayed) for o in out] == [
        ("b", 20, False),
        ("a", 10, False),
        ("a", 10, True),
    ]
    seen = sorted(k for call in calls for k, _ in call)
    assert seen == ["a", "b"]
    again = inbox.process_batch(batch, batch_handler=handle)
    assert all(o.replayed for o in again) and sorted(k for c in calls for k, _ in c) == seen
    failing = inbox.process_batch([("c", {"n": 3, "boom": True})], batch_handler=handle)
    assert isinstance(failing[0].error, RuntimeError)
    record = onceonly.Admin(store).show("billing", "c")
    assert record is not None and record.state.value == "failed" and record.attempts == 1


def test_handler_or_batch_handler(store: Any) -> None:
    inbox = onceonly.Inbox(store, "billing")
    with pytest.raises(onceonly.ConfigurationError, match="either handler or batch_handler"):
        inbox.process_batch([("a", 1)])
    with pytest.raises(onceonly.ConfigurationError, match="either handler or batch_handler"):
        inbox.process_batch([("a", 1)], lambda p, tx: 1, batch_handler=lambda ms, tx: None)
    out = inbox.process_batch([("a", 1), ("b", 2)], batch_handler=lambda ms, tx: None)
    assert [o.result for o in out] == [None, None]


async def test_async_batch_handler(async_store: Any) -> None:
    inbox = onceonly.AsyncInbox(async_store, "billing")

    async def handle(messages: list[onceonly.BatchMessage], tx: onceonly.AsyncTx) -> list[str]:
        return [m.key.upper() for m in messages]

    out = await inbox.process_batch([("y", 1), ("x", 2)], batch_handler=handle)
    assert [(o.key, o.result) for o in out] == [("y", "Y"), ("x", "X")]
