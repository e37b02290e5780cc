# SPDX-License-Identifier: MIT
"""The outbox relay behind PgBouncer: through transaction pooling LISTEN cannot work (the
LISTEN lands on whichever server connection is free, and the NOTIFY goes there), so the
relay finds that out, says so once and polls with backoff; through session pooling it
LISTENs as on a direct connection. Real PgBouncer instances (``scripts/services
pgbouncer``)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import onceonly
from onceonly.testing import AsyncListPublisher, ListPublisher
from tests.conftest import (
    PGBOUNCER_SESSION_URL,
    PGBOUNCER_URL,
    drop_pg_table,
    require_pgbouncer,
    unique_table,
)

FALLBACK = "LISTEN cannot work"


@pytest.fixture
def table() -> Iterator[str]:
    require_pgbouncer(PGBOUNCER_URL)
    require_pgbouncer(PGBOUNCER_SESSION_URL)
    name = unique_table()
    yield name
    drop_pg_table(name)
    drop_pg_table(f"{name}_outbox")


def _three_messages_after_idle(store: Any, pub: ListPublisher) -> list[float]:
    """Publish three rows, each after 1.5 s of idleness; how long each took to go out."""
    waits = []
    for i in range(3):
        time.sleep(1.5)
        with store.transaction() as session:
            onceonly.Outbox(store).publish(session.connection, "t", {"i": i})
        t0 = time.monotonic()
        while len(pub.messages) <= i and time.monotonic() - t0 < 10:
            time.sleep(0.01)
        waits.append(time.monotonic() - t0)
    return waits


@pytest.mark.parametrize("how", ["transaction", "session"])
def test_relay_wakes_up_behind_pgbouncer(
    table: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An idle relay (poll_interval 30 s) sends each of 3 rows within 1.5 s: through
    transaction pooling by polling with backoff (said once, at INFO), through session
    pooling on its NOTIFY (nothing said)."""
    url = PGBOUNCER_URL if how == "transaction" else PGBOUNCER_SESSION_URL
    store = onceonly.open_store(url, table=table, outbox_table=f"{table}_outbox")
    store.migrate()
    pub = ListPublisher()
    relay = onceonly.Relay(store, pub, poll_interval=30.0)
    caplog.set_level(logging.INFO, logger="onceonly.relay")
    t = threading.Thread(target=relay.run)
    t.start()
    try:
        waits = _three_messages_after_idle(store, pub)
    finally:
        relay.stop()
        t.join(10)
        store.close()
    assert len(pub.messages) == 3
    assert max(waits) < 1.5, waits  # the poll would have taken 30 s
    said = [r for r in caplog.records if FALLBACK in r.getMessage()]
    if how == "transaction":
        assert [r.levelname for r in said] == ["INFO"]
    else:
        assert said == []


def test_async_relay_polls_behind_transaction_pooling(
    table: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The async relay through transaction pooling: 3 rows each out within 1.5 s, the
    fallback said once."""
    caplog.set_level(logging.INFO, logger="onceonly.relay")

    async def main() -> list[float]:
        store = onceonly.open_async_store(
            PGBOUNCER_URL, table=table, outbox_table=f"{table}_outbox"
        )
        await store.migrate()
        pub = AsyncListPublisher()
        relay = onceonly.AsyncRelay(store, pub, poll_interval=30.0)
        task = asyncio.ensure_future(relay.run())
        waits = []
        try:
            for i in range(3):
                await asyncio.sleep(1.5)
                async with store.transaction() as session:
                    await onceonly.AsyncOutbox(store).publish(session.connection, "t", {"i": i})
                t0 = time.monotonic()
                while len(pub.messages) <= i and time.monotonic() - t0 < 10:
                    await asyncio.sleep(0.01)
                waits.append(time.monotonic() - t0)
        finally:
            relay.stop()
            await asyncio.wait_for(task, 10)
            await store.close()
        return waits

    waits = asyncio.run(main())
    assert max(waits) < 1.5, waits
    said = [r for r in caplog.records if FALLBACK in r.getMessage()]
    assert [r.levelname for r in said] == ["INFO"]


def test_polling_backs_off_and_stays_across_outages() -> None:
    """Polling waits 50 ms after a poll that found rows, doubles to at most 1 s (or the
    poll interval), and a reconnection after an outage keeps it (no new check)."""
    from onceonly.outbox._wake import POLL_CAP, POLL_FIRST, Polling, close_listener

    polling = Polling()
    waits = [polling.next_wait(False, 30.0) for _ in range(7)]
    assert waits == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0] and (POLL_FIRST, POLL_CAP) == (0.05, 1)
    assert polling.next_wait(True, 30.0) == 0.05
    assert polling.next_wait(False, 0.07) == 0.07  # never longer than poll_interval
    assert close_listener(polling) is polling
    assert close_listener(None) is None
