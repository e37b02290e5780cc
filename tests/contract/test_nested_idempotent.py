# SPDX-License-Identifier: MIT
"""A leased call inside an atomic handler on the same store is refused at once
(docs/modes.md, "A leased call inside an atomic handler")."""

from __future__ import annotations

import time
from typing import Any

import pytest

import onceonly
from tests.conftest import StoreFactory


def test_idempotent_inside_an_atomic_handler_on_the_same_store_fails_at_once(
    sql_store: Any,
) -> None:
    """SQLite used to wait its busy timeout (10 s), a full pool its pool timeout."""
    inbox = onceonly.Inbox(sql_store, consumer="nested", max_attempts=2)
    runs: list[str] = []

    @onceonly.idempotent(sql_store, key=lambda x: x, scope="nested.inner")
    def inner(x: str) -> str:
        runs.append(x)
        return x

    @inbox.handler(key=lambda m: m["id"])
    def handle(msg: dict[str, str], tx: Any) -> str:
        return inner(msg["id"])

    started = time.monotonic()
    with pytest.raises(onceonly.ConfigurationError, match="same store"):
        handle({"id": "m1"})
    assert time.monotonic() - started < 1.0
    assert runs == []
    # counted: the message ends dead instead of coming back for ever
    with pytest.raises(onceonly.ConfigurationError):
        handle({"id": "m1"})
    with pytest.raises(onceonly.DeadLettered):
        handle({"id": "m1"})


def test_idempotent_on_a_store_of_its_own_inside_an_atomic_handler_runs(
    pg_store_factory: StoreFactory,
) -> None:
    """The way out the error names: the decorator on another store object (not on
    SQLite, whose one writer would wait for the handler's transaction)."""
    outer = pg_store_factory()
    outer.migrate()
    own = pg_store_factory()
    inbox = onceonly.Inbox(outer, consumer="nested")

    @onceonly.idempotent(own, key=lambda x: x, scope="nested.inner")
    def inner(x: str) -> str:
        return x.upper()

    @inbox.handler(key=lambda m: m["id"])
    def handle(msg: dict[str, str], tx: Any) -> str:
        return inner(msg["id"])

    assert handle({"id": "m1"}).result == "M1"
    assert handle({"id": "m1"}).replayed
