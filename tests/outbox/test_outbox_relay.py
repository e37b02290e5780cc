# SPDX-License-Identifier: MIT
"""Outbox writes and the relay, on SQLite and PostgreSQL (docs/spec.md §4).

The broker here is ``onceonly.testing.ListPublisher`` (an in-process publisher that can
refuse on demand); the real brokers are exercised in tests/brokers and tests/e2e.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import onceonly
from onceonly.testing import ListPublisher


def _inbox_publishing(store: Any, topic: str = "orders", fail: bool = False) -> Any:
    inbox = onceonly.Inbox(store, consumer="producer")

    def handler(payload: Any, tx: onceonly.Tx) -> str:
        mid = tx.publish(topic, payload, key=payload.get("key"), headers={"source": "test"})
        if fail:
            raise RuntimeError("after publish")
        return mid

    return inbox, handler


def test_publish_commits_with_the_handler(sql_store: Any) -> None:
    """tx.publish writes a row that the relay publishes with the same id, once."""
    inbox, handler = _inbox_publishing(sql_store)
    mid = inbox.process("m-1", {"n": 1}, handler).result
    assert inbox.process("m-1", {"n": 1}, handler).replayed  # no second outbox row
    pub = ListPublisher()
    stats = onceonly.Relay(sql_store, pub).run_once()
    assert stats.published == 1
    [msg] = pub.messages
    assert (msg.id, msg.topic, msg.decoded(), dict(msg.headers)) == (
        mid,
        "orders",
        {"n": 1},
        {"source": "test"},
    )
    assert onceonly.Relay(sql_store, pub).run_once().published == 0  # deleted


def test_failed_handler_publishes_nothing(sql_store: Any) -> None:
    """A handler that raises after tx.publish leaves no outbox row."""
    inbox, handler = _inbox_publishing(sql_store, fail=True)
    with pytest.raises(RuntimeError):
        inbox.process("m-1", {"n": 1}, handler)
    assert onceonly.Outbox(sql_store).counts() == {"pending": 0, "dead": 0}


def test_outbox_on_a_caller_connection(sql_store: Any) -> None:
    """Outbox.publish joins the caller's transaction; its rollback removes the row."""
    outbox = onceonly.Outbox(sql_store)
    with sql_store.transaction() as session:
        kept = outbox.publish(session.connection, "t", {"a": 1})
    with pytest.raises(ZeroDivisionError), sql_store.transaction() as session:
        outbox.publish(session.connection, "t", {"a": 2})
        raise ZeroDivisionError
    pub = ListPublisher()
    onceonly.Relay(sql_store, pub).run_once()
    assert [m.id for m in pub.messages] == [kept]


def test_outbox_bad_input(sql_store: Any) -> None:
    """Bad topics, keys, headers and oversized payloads are refused before writing."""
    outbox = onceonly.Outbox(sql_store, max_payload_bytes=50)
    with sql_store.transaction() as session:
        conn = session.connection
        with pytest.raises(onceonly.InvalidKey):
            outbox.publish(conn, "", {})
        with pytest.raises(onceonly.InvalidKey):
            outbox.publish(conn, "t", {}, key="bad\nkey")
        with pytest.raises(onceonly.InvalidKey):
            outbox.publish(conn, "t", {}, headers={"h": 1})  # type: ignore[dict-item]
        with pytest.raises(onceonly.TooLarge):
            outbox.publish(conn, "t", {"x": "y" * 100})
        with pytest.raises(onceonly.EncodingError):
            outbox.publish(conn, "t", {"x": object()})
    assert outbox.counts() == {"pending": 0, "dead": 0}


def test_failures_back_off_then_dead_then_redrive(sql_store: Any) -> None:
    """A refused row is retried with backoff, dead after max_attempts, redriven by hand."""
    outbox = onceonly.Outbox(sql_store)
    with sql_store.transaction() as session:
        mid = outbox.publish(session.connection, "flaky", {"a": 1})
    pub = ListPublisher(fail={"flaky": -1})
    relay = onceonly.Relay(sql_store, pub, max_attempts=3, backoff_base=0.05, backoff_cap=0.05)
    assert relay.run_once().failed == 1
    assert relay.run_once().batches == 0  # backing off: not eligible yet
    time.sleep(0.06)
    assert relay.run_once().failed == 1
    time.sleep(0.06)
    assert relay.run_once().dead == 1
    time.sleep(0.06)
    assert relay.run_once().batches == 0  # dead rows are not retried
    [row] = outbox.rows("dead")
    assert row.message.id == mid and row.message.attempts == 3
    assert "refused flaky" in (row.last_error or "")
    pub.fail.clear()
    assert outbox.redrive(mid) == 1
    assert relay.run_once().published == 1
    assert [m.id for m in pub.messages] == [mid]
    assert outbox.counts() == {"pending": 0, "dead": 0}


def test_late_commit_is_not_skipped(pg_store_factory: Any) -> None:
    """A row whose transaction commits after later rows were relayed is still relayed.

    PostgreSQL only: SQLite serialises writers, so a later insert cannot commit first.
    """
    store = pg_store_factory()
    store.migrate()
    outbox = onceonly.Outbox(store)
    pub = ListPublisher()
    relay = onceonly.Relay(store, pub)
    with store.transaction() as slow:
        early = outbox.publish(slow.connection, "t", {"n": 1})
        with store.transaction() as fast:
            late = outbox.publish(fast.connection, "t", {"n": 2})
        assert relay.run_once().published == 1
    assert relay.run_once().published == 1
    assert [m.id for m in pub.messages] == [late, early]


def test_two_relays_publish_each_row_once(sql_store_factory: Any) -> None:
    """Relays running side by side never publish the same row twice."""
    store = sql_store_factory()
    store.migrate()
    outbox = onceonly.Outbox(store)
    ids = []
    for i in range(300):
        with store.transaction() as session:
            ids.append(outbox.publish(session.connection, "t", {"n": i}))

    class SlowishPublisher(ListPublisher):
        def publish(self, message: Any) -> None:
            time.sleep(0.001)  # a broker round trip, so relays overlap
            super().publish(message)

    pub = SlowishPublisher()
    relays = [
        onceonly.Relay(sql_store_factory(), pub, batch_size=7, poll_interval=0.05) for _ in range(3)
    ]
    threads = [threading.Thread(target=r.run) for r in relays]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while len(pub.messages) < len(ids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for r in relays:
        r.stop()
    for t in threads:
        t.join(10)
    published = [m.id for m in pub.messages]
    assert sorted(published) == sorted(ids)
    assert len(published) == len(set(published))
    assert sum(r.stats.published for r in relays) == len(ids)
    assert sum(1 for r in relays if r.stats.published) >= 2  # they really shared the work


def test_ordered_keys_publish_in_insert_order(sql_store: Any) -> None:
    """With ordered=True a key's messages go out in insert order, even across failures."""
    outbox = onceonly.Outbox(sql_store, ordered=True)
    for i in range(4):
        for key in ("a", "b"):
            with sql_store.transaction() as session:
                outbox.publish(session.connection, f"t{key}", {"i": i}, key=key)
    pub = ListPublisher(fail={"ta": 1})  # the first publish of key a fails once
    relay = onceonly.Relay(sql_store, pub, ordered=True, backoff_base=0.02, backoff_cap=0.02)
    first = relay.run_once()
    assert (first.published, first.failed) == (1, 1)  # one in flight per key
    deadline = time.monotonic() + 10
    while len(pub.messages) < 8 and time.monotonic() < deadline:
        relay.run_once()
        time.sleep(0.01)
    for key in ("a", "b"):
        order = [m.decoded()["i"] for m in pub.messages if m.key == key]
        assert order == [0, 1, 2, 3]


def test_graceful_stop_finishes_the_batch(sql_store: Any) -> None:
    """stop() lets the batch in hand finish; every claimed row is published and settled."""
    outbox = onceonly.Outbox(sql_store)
    for i in range(20):
        with sql_store.transaction() as session:
            outbox.publish(session.connection, "t", {"i": i})
    started = threading.Event()

    class SlowPublisher(ListPublisher):
        def publish(self, message: Any) -> None:
            started.set()
            time.sleep(0.01)
            super().publish(message)

    pub = SlowPublisher()
    relay = onceonly.Relay(sql_store, pub, batch_size=10, poll_interval=0.05)
    t = threading.Thread(target=relay.run)
    t.start()
    assert started.wait(5)
    relay.stop()
    t.join(10)
    assert not t.is_alive()
    counts = outbox.counts()
    assert len(pub.messages) in (10, 20)  # whole batches only
    assert counts["pending"] == 20 - len(pub.messages)


def test_postgres_relay_wakes_on_notify(pg_store_factory: Any) -> None:
    """On PostgreSQL an idle relay is woken by the insert's NOTIFY, long before its poll."""
    store = pg_store_factory()
    store.migrate()
    pub = ListPublisher()
    relay = onceonly.Relay(store, pub, poll_interval=30.0)
    t = threading.Thread(target=relay.run)
    t.start()
    try:
        time.sleep(0.5)  # the relay polled once, found nothing, and now LISTENs
        with store.transaction() as session:
            mid = onceonly.Outbox(store).publish(session.connection, "t", {"a": 1})
        t0 = time.monotonic()
        while not pub.messages and time.monotonic() - t0 < 10:
            time.sleep(0.01)
        waited = time.monotonic() - t0
    finally:
        relay.stop()
        t.join(10)
    assert [m.id for m in pub.messages] == [mid]
    assert waited < 3.0  # the poll would have taken 30 s


async def test_async_relay_on_postgres(tmp_path: Any) -> None:
    """AsyncRelay publishes rows written through AsyncInbox's tx.publish, and stops."""
    import asyncio

    from onceonly.testing import AsyncListPublisher
    from tests.conftest import drop_pg_table, require_postgres, unique_table

    url = require_postgres()
    table = unique_table()
    store = onceonly.open_async_store(url, table=table, outbox_table=f"{table}_outbox")
    try:
        await store.migrate()
        inbox = onceonly.AsyncInbox(store, consumer="c")

        async def handler(payload: Any, tx: onceonly.AsyncTx) -> str:
            return await tx.publish("topic", payload)

        ids = [(await inbox.process(f"k{i}", {"i": i}, handler)).result for i in range(5)]
        pub = AsyncListPublisher()
        relay = onceonly.AsyncRelay(store, pub, poll_interval=0.05)
        task = asyncio.ensure_future(relay.run())
        for _ in range(200):
            if len(pub.messages) == 5:
                break
            await asyncio.sleep(0.02)
        relay.stop()
        stats = await asyncio.wait_for(task, 10)
        assert sorted(m.id for m in pub.messages) == sorted(ids)
        assert stats.published == 5
    finally:
        await store.close()
        drop_pg_table(table)
        drop_pg_table(f"{table}_outbox")
