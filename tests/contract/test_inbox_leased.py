# SPDX-License-Identifier: MIT
"""Inbox in leased mode (docs/spec.md §1.4a): on Redis (no transactions), and on the
memory store forced with ``mode="leased"``."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly.events import Event, EventKind
from onceonly.messaging import Delivery
from tests.conftest import REDIS_URL, StoreFactory, drop_redis_prefix, require_redis, unique_table


@pytest.fixture(params=["memory", "redis"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Builds a leased Inbox (memory: mode='leased'; Redis: leased by default)."""
    factory = StoreFactory(request.param, tmp_path)
    store = factory()
    store.migrate()

    def inbox(**options: Any) -> onceonly.Inbox:
        if factory.kind == "memory":
            options.setdefault("mode", "leased")
        return onceonly.Inbox(store, consumer="billing", **options)

    yield inbox
    factory.close()


def test_new_then_replay_with_the_delivery(make: Any) -> None:
    """The handler runs once with tx.delivery; a duplicate replays the stored result."""
    inbox = make()
    assert inbox.mode == "leased"
    delivery = Delivery(message_id="m-1", source="q", delivery_count=1, redelivered=False)
    seen: list[Any] = []

    def handler(msg: Any, tx: onceonly.Tx) -> dict[str, Any]:
        seen.append((tx.key, tx.scope, tx.attempt, tx.delivery))
        return {"charged": msg["amount"]}

    first = inbox.process("m-1", {"amount": 3}, handler, delivery=delivery)
    again = inbox.process("m-1", {"amount": 3}, handler)
    assert (first.result, first.replayed, first.attempt) == ({"charged": 3}, False, 1)
    assert (again.result, again.replayed) == ({"charged": 3}, True)
    assert seen == [("m-1", "billing", 1, delivery)]
    with pytest.raises(onceonly.PayloadMismatch):
        inbox.process("m-1", {"amount": 4}, handler)


def test_failures_count_to_dead(make: Any) -> None:
    """Each failure is counted; at max_attempts the key is dead and stays dead."""
    inbox = make(max_attempts=2)
    attempts: list[int] = []

    def handler(msg: Any, tx: onceonly.Tx) -> None:
        attempts.append(tx.attempt)
        raise RuntimeError("provider down")

    for _ in range(2):
        with pytest.raises(RuntimeError, match="provider down"):
            inbox.process("m-1", {}, handler)
    with pytest.raises(onceonly.DeadLettered) as dead:
        inbox.process("m-1", {}, handler)
    assert attempts == [1, 2]
    assert dead.value.attempts == 2


def test_tx_has_no_transaction(make: Any) -> None:
    """tx.execute / connection / session / publish raise ConfigurationError (counted)."""
    inbox = make(max_attempts=9)
    uses = [
        lambda tx: tx.execute("SELECT 1"),
        lambda tx: tx.connection,
        lambda tx: tx.session,
        lambda tx: tx.publish("topic", {}),
    ]
    for n, use in enumerate(uses):
        with pytest.raises(onceonly.ConfigurationError, match="leased mode"):
            inbox.process(f"m-{n}", {}, lambda msg, tx, use=use: use(tx))
    with pytest.raises(onceonly.ConfigurationError, match="atomic mode"):
        inbox.process("m-9", {}, lambda msg, tx: None, connection=object())
    with pytest.raises(onceonly.ConfigurationError, match="atomic mode"):
        inbox.process_batch([("m-9", {})], lambda msg, tx: None)


def test_in_flight_then_one_run_for_interleaved_workers(make: Any) -> None:
    """A second worker on a key held by a live claim gets InFlight (short wait) or waits
    and replays (long wait): the handler runs once."""
    inbox = make(lease=5)
    impatient = make(lease=5, wait=0.05)
    started, release = threading.Event(), threading.Event()
    runs: list[int] = []
    outcomes: list[Any] = []

    def handler(msg: Any, tx: onceonly.Tx) -> int:
        runs.append(tx.attempt)
        started.set()
        release.wait(5)
        return 7

    first = threading.Thread(target=lambda: outcomes.append(inbox.process("k", 1, handler)))
    first.start()
    assert started.wait(5)
    with pytest.raises(onceonly.InFlight):
        impatient.process("k", 1, handler)
    second = threading.Thread(target=lambda: outcomes.append(inbox.process("k", 1, handler)))
    second.start()
    time.sleep(0.1)
    release.set()
    first.join(5)
    second.join(5)
    assert runs == [1]
    assert sorted((o.result, o.replayed) for o in outcomes) == [(7, False), (7, True)]


def test_lease_is_renewed_while_the_handler_runs(make: Any) -> None:
    """A handler running 4 leases long keeps its claim: no takeover, one run."""
    renewed: list[Event] = []
    inbox = make(lease=0.15, listeners=[renewed.append])
    other = make(lease=0.15, wait=0.01)
    runs: list[str] = []
    took_over: list[Any] = []

    def slow(msg: Any, tx: onceonly.Tx) -> str:
        runs.append("slow")
        for _ in range(4):
            time.sleep(0.15)
            # past the first lease: without renewal the claim has lapsed
            with contextlib.suppress(onceonly.InFlight):
                took_over.append(other.process("k", 1, lambda m, t: runs.append("other")))
        return "done"

    assert inbox.process("k", 1, slow).result == "done"
    assert (runs, took_over) == (["slow"], [])
    assert any(e.kind is EventKind.LEASE_RENEWED for e in renewed)


def test_modes_and_options() -> None:
    """mode= is validated; lease= and outbox= belong to their modes."""
    store = onceonly.open_store("memory://")
    assert onceonly.Inbox(store, consumer="c").mode == "atomic"
    with pytest.raises(onceonly.ConfigurationError, match="mode must be"):
        onceonly.Inbox(store, consumer="c", mode="fast")
    with pytest.raises(onceonly.ConfigurationError, match="lease= is for leased"):
        onceonly.Inbox(store, consumer="c", lease=3)
    with pytest.raises(onceonly.ConfigurationError, match="outbox= needs atomic"):
        onceonly.Inbox(store, consumer="c", mode="leased", outbox=object())  # type: ignore[arg-type]


async def test_async_leased_inbox_on_redis() -> None:
    """AsyncInbox on the async Redis store: leased, renews, replays, refuses tx.execute."""
    require_redis()
    prefix = f"{unique_table()}:"
    store = onceonly.open_async_store(REDIS_URL, prefix=prefix)
    try:
        inbox = onceonly.AsyncInbox(store, consumer="billing", lease=0.15)
        assert inbox.mode == "leased"
        runs: list[int] = []

        async def handler(msg: Any, tx: onceonly.AsyncTx) -> int:
            runs.append(tx.attempt)
            await asyncio.sleep(0.5)  # three leases: renewed by the heartbeat
            return int(msg) * 2

        async def refused(msg: Any, tx: onceonly.AsyncTx) -> Any:
            return await tx.execute("SELECT 1")

        async def late() -> onceonly.Outcome[int]:
            await asyncio.sleep(0.3)  # past the first lease: the claim must still be held
            return await inbox.process("k", 21, handler)

        first, second = await asyncio.gather(inbox.process("k", 21, handler), late())
        assert runs == [1]
        assert {(first.result, first.replayed), (second.result, second.replayed)} == {
            (42, False),
            (42, True),
        }
        with pytest.raises(onceonly.ConfigurationError, match="leased mode"):
            await inbox.process("k2", 1, refused)
    finally:
        await store.close()
        drop_redis_prefix(prefix)
