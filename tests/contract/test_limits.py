# SPDX-License-Identifier: MIT
"""Huge durations (``inf``, ``timedelta.max``, ``1e300``, 30 days) for ``wait``, ``ttl``, ``lease``.

A huge ``wait`` waits (for ever, or as long as the store can), never less; a huge
``ttl`` or ``lease`` either works or is refused with ``ConfigurationError`` when the
inbox or decorator is built, never later with another error (docs/spec.md §2.6).
"""

from __future__ import annotations

import datetime as dt
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly import _runtime
from onceonly.stores.memory import MemoryStore

HUGE = {
    "inf": float("inf"),
    "timedelta.max": dt.timedelta.max,
    "1e300": 1e300,
    "30days": dt.timedelta(days=30),
}


@pytest.mark.parametrize("value", list(HUGE))
def test_inbox_huge_wait_processes_and_replays(
    request: pytest.FixtureRequest, store_factory: Any, value: str
) -> None:
    """Inbox(wait=huge) processes a message and replays it, on every store."""
    store = store_factory()
    store.migrate()
    inbox = onceonly.Inbox(store, "limits", wait=HUGE[value])
    assert inbox.process("k", {}, lambda p, tx: 1).replayed is False
    assert inbox.process("k", {}, lambda p, tx: 2).result == 1


@pytest.mark.parametrize("value", list(HUGE))
def test_sqlite_huge_wait_waits_for_the_write_lock(
    request: pytest.FixtureRequest, tmp_path: Path, value: str
) -> None:
    """A huge wait on SQLite waits for a writer that finishes; it never waits less."""
    path = tmp_path / "limits.db"
    store = onceonly.open_store(f"sqlite:///{path}")
    store.migrate()
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.3, holder.rollback)
    release.start()
    try:
        out = onceonly.Inbox(store, "limits", wait=HUGE[value]).process("k", {}, lambda p, tx: 1)
        assert out.result == 1
    finally:
        release.join()
        holder.close()
        store.close()


def _built_or_refused(build: Any) -> Any:
    """The object ``build()`` makes, or None if it refused the value with ConfigurationError."""
    try:
        return build()
    except onceonly.ConfigurationError:
        return None


@pytest.mark.parametrize("value", list(HUGE))
def test_inbox_huge_ttl_works_or_is_refused_up_front(
    request: pytest.FixtureRequest, store_factory: Any, value: str
) -> None:
    """Inbox(ttl=huge) remembers the key, or is a ConfigurationError when built."""
    store = store_factory()
    store.migrate()
    inbox = _built_or_refused(lambda: onceonly.Inbox(store, "limits", ttl=HUGE[value]))
    if inbox is not None:
        inbox.process("k", {}, lambda p, tx: 1)
        assert inbox.process("k", {}, lambda p, tx: 2).result == 1


@pytest.fixture
def renewals(monkeypatch: pytest.MonkeyPatch) -> list[BaseException | None]:
    """A renewal scheduler of the test's own, and the exceptions that kill threads.

    A sync lease past ``threading.TIMEOUT_MAX`` kills the scheduler's thread; a private
    one keeps that from stopping the renewals of the tests that run next.
    """
    monkeypatch.setattr(_runtime._Renewals, "_instance", None)
    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    return died


@pytest.mark.parametrize("option", ["ttl", "lease"])
@pytest.mark.parametrize("value", list(HUGE))
def test_idempotent_huge_ttl_or_lease_works_or_is_refused_up_front(
    request: pytest.FixtureRequest,
    leased_store_factory: Any,
    renewals: list[BaseException | None],
    option: str,
    value: str,
) -> None:
    """@idempotent(ttl=/lease=huge) runs once and replays, or refuses the value when built."""
    store = leased_store_factory()
    store.migrate()
    decorate = _built_or_refused(
        lambda: onceonly.idempotent(store, key=lambda: "k", scope="limits", **{option: HUGE[value]})
    )
    if decorate is not None:
        calls: list[int] = []
        fn = decorate(lambda: calls.append(1) or len(calls))
        assert fn() == fn() == 1
        time.sleep(0.05)  # the renewal thread has seen the heartbeat
    assert renewals == []


@pytest.mark.parametrize("value", list(HUGE))
def test_huge_sync_lease_leaves_other_renewals_running(
    request: pytest.FixtureRequest, renewals: list[BaseException | None], value: str
) -> None:
    """One call with a huge lease must not stop the renewal of every other sync lease."""
    store = MemoryStore()
    huge = _built_or_refused(
        lambda: onceonly.idempotent(store, key=lambda: "huge", scope="limits", lease=HUGE[value])
    )
    if huge is not None:
        huge(lambda: None)()
        time.sleep(0.05)  # the renewal thread has seen the huge heartbeat

    @onceonly.idempotent(store, key=lambda: "short", scope="limits", lease=0.3)
    def short() -> float:
        time.sleep(0.6)
        with store.session() as s:
            snap = s.get("limits", "short")
        assert snap.record is not None and snap.record.lease_until is not None
        return snap.record.lease_until - snap.now

    assert short() > 0, "the lease was not renewed"
    assert renewals == []
