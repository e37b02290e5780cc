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


class Cached(Exception):
    """A business error the inbox caches (``cache_errors``)."""


@pytest.mark.parametrize("form", ["handler", "batch_handler"])
def test_a_cached_error_comes_again_as_its_messages_outcome(store: Any, form: str) -> None:
    """A redelivered batch holding a key whose error was cached: that key's outcome
    carries the cached error, the others replay or run (found black-box: the set-based
    batch raised the cached error out of the whole batch)."""
    inbox = onceonly.Inbox(store, consumer="cached", cache_errors=(Cached,))

    def per_message(payload: Any, tx: onceonly.Tx) -> Any:
        if payload == "bad":
            raise Cached("cached business error")
        return payload

    def together(messages: list[onceonly.BatchMessage], tx: onceonly.Tx) -> list[Any]:
        if any(m.payload == "bad" for m in messages):
            raise Cached("cached business error")
        return [m.payload for m in messages]

    def run(items: list[tuple[str, Any]]) -> list[onceonly.Outcome[Any]]:
        if form == "handler":
            return inbox.process_batch(items, per_message)
        return inbox.process_batch(items, batch_handler=together)

    first = run([("x", "bad"), ("y", 5)])
    assert isinstance(first[0].error, Cached)
    again = run([("x", "bad"), ("y", 5), ("z", 6)])
    assert [o.key for o in again] == ["x", "y", "z"]
    assert isinstance(again[0].error, Cached)
    assert again[2].error is None and again[2].result == 6
    if form == "handler":  # y completed in the first batch: replayed
        assert again[1].replayed and again[1].result == 5
