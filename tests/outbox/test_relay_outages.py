# SPDX-License-Identifier: MIT
"""The relay waits out an unavailable database and stops on errors retrying cannot cure
(docs/spec.md §4). PostgreSQL restarts and killed connections are in tests/faults."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

import pytest

import onceonly
from onceonly.testing import ListPublisher


def test_relay_waits_out_a_locked_sqlite_database(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A write lock held past the lock wait is an outage: retried, logged once, no loss."""
    caplog.set_level(logging.INFO, logger="onceonly.relay")
    path = tmp_path / "o.db"
    store = onceonly.open_store(f"sqlite:///{path}")
    store.migrate()
    outbox = onceonly.Outbox(store)
    ids = []
    for i in range(3):
        with store.transaction() as session:
            ids.append(outbox.publish(session.connection, "t", {"i": i}))
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # every other writer waits
    pub = ListPublisher()
    relay = onceonly.Relay(store, pub, poll_interval=0.05)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            relay.run()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    try:
        deadline = time.monotonic() + 15

        def relay_logged() -> bool:
            return any(r.name == "onceonly.relay" for r in caplog.records)

        while not relay_logged() and time.monotonic() < deadline:
            time.sleep(0.05)  # until the claim's lock wait ran out
        assert t.is_alive() and not pub.messages
        blocker.execute("ROLLBACK")
        while len(pub.messages) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert t.is_alive(), errors
    finally:
        blocker.close()
        relay.stop()
        t.join(15)
        store.close()
    assert not errors
    assert sorted(m.id for m in pub.messages) == sorted(ids)
    assert (relay.stats.published, relay.stats.failed, relay.stats.dead) == (3, 0, 0)
    records = [r for r in caplog.records if r.name == "onceonly.relay"]
    warnings = [r for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "busy" in warnings[0].getMessage()
    assert sum("is back" in r.getMessage() for r in records if r.levelno == logging.INFO) == 1


def test_relay_run_ends_on_an_error_retrying_cannot_cure(tmp_path: Path) -> None:
    """A missing outbox table ends run() with StoreError, not a driver error or a loop."""
    store = onceonly.open_store(f"sqlite:///{tmp_path / 'o.db'}")
    relay = onceonly.Relay(store, ListPublisher(), table="no_such_outbox")
    try:
        with pytest.raises(onceonly.StoreError, match="no_such_outbox") as info:
            relay.run()
    finally:
        store.close()
    assert not isinstance(info.value, onceonly.StoreUnavailable)


def test_reconnect_settings_are_checked(tmp_path: Path) -> None:
    """reconnect_base must be positive and reconnect_cap at least as large."""
    store = onceonly.open_store(f"sqlite:///{tmp_path / 'o.db'}")
    try:
        with pytest.raises(ValueError, match="reconnect"):
            onceonly.Relay(store, ListPublisher(), reconnect_base=0)
        with pytest.raises(ValueError, match="reconnect"):
            onceonly.Relay(store, ListPublisher(), reconnect_base=1.0, reconnect_cap=0.5)
    finally:
        store.close()
