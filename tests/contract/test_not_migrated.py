# SPDX-License-Identifier: MIT
"""A store used before ``migrate()`` says so (NotMigrated), on every surface; options
are checked; ``open_store(url, migrate=True)`` migrates."""

from __future__ import annotations

from typing import Any

import pytest

import onceonly
from onceonly._core.settle import NOT_MIGRATED, Action, Backoff, Stage, verdict
from tests.conftest import StoreFactory, business_table


def test_the_inbox_before_migrate_says_run_migrate(sql_store_factory: StoreFactory) -> None:
    """Inbox.process on a store whose tables do not exist raises NotMigrated."""
    store = sql_store_factory()
    inbox = onceonly.Inbox(store, consumer="c")
    with pytest.raises(onceonly.NotMigrated, match=r"run store\.migrate\(\) first"):
        inbox.process("k", {"a": 1}, lambda msg, tx: 1)
    assert isinstance(onceonly.NotMigrated("x"), onceonly.ConfigurationError)


def test_leased_mode_before_migrate_says_run_migrate(sql_store_factory: StoreFactory) -> None:
    """@idempotent on a store whose tables do not exist raises NotMigrated, unrun."""
    store = sql_store_factory()
    ran: list[Any] = []

    @onceonly.idempotent(store, key=lambda x: x, scope="first-hour")
    def f(x: str) -> str:
        ran.append(x)
        return x

    with pytest.raises(onceonly.NotMigrated):
        f("a")
    assert ran == []


async def test_the_async_inbox_before_migrate_says_run_migrate(
    sql_store_factory: StoreFactory,
) -> None:
    """The async face raises the same error."""
    url = sql_store_factory.url
    store = onceonly.open_async_store(url, table=sql_store_factory.table)
    try:
        inbox = onceonly.AsyncInbox(store, consumer="c")

        async def handler(msg: Any, tx: Any) -> int:
            return 1

        with pytest.raises(onceonly.NotMigrated):
            await inbox.process("k", {"a": 1}, handler)
    finally:
        await store.close()


def test_a_missing_business_table_is_the_handlers_failure(sql_store: Any) -> None:
    """Only the store's own statements say NotMigrated: a handler's missing table is its
    own (counted) failure with the driver's error."""
    inbox = onceonly.Inbox(sql_store, consumer="c", max_attempts=3)

    def handler(msg: Any, tx: Any) -> None:
        tx.execute("INSERT INTO no_such_business_table (id) VALUES (?)", ("x",))

    with pytest.raises(Exception) as caught:
        inbox.process("k", {"a": 1}, handler)
    assert not isinstance(caught.value, onceonly.NotMigrated)
    with sql_store.session() as s:
        record = s.get("c", "k").record
    assert record is not None and record.attempts == 1


def test_open_store_migrate_true(sql_store_factory: StoreFactory) -> None:
    """migrate=True creates the tables, so the first call works."""
    store = sql_store_factory(migrate=True)
    count = business_table(store)
    inbox = onceonly.Inbox(store, consumer="c")

    def handler(msg: Any, tx: Any) -> None:
        tx.execute(f"INSERT INTO {store.table}_ledger (id, amount) VALUES (?, ?)", ("k", 1))

    assert not inbox.process("k", {"a": 1}, handler).replayed
    assert count() == 1


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
def test_unknown_options_are_refused_with_the_valid_ones(kind: str, tmp_path: Any) -> None:
    """A misspelt option is a ConfigurationError that lists the options there are."""
    url = {
        "memory": "memory://",
        "sqlite": f"sqlite:///{tmp_path / 'x.db'}",
        "postgres": "postgresql://postgres@127.0.0.1:5432/test",
    }[kind]
    with pytest.raises(onceonly.ConfigurationError, match="unknown option tabel") as caught:
        onceonly.open_store(url, tabel="x")
    assert "valid options:" in str(caught.value)
    if kind != "memory":
        assert "table" in str(caught.value).split("valid options:")[1]
    with pytest.raises(onceonly.ConfigurationError, match="unknown option"):
        onceonly.open_async_store(url, tabel="x")


def test_consumers_retry_not_migrated_without_counting() -> None:
    """A consumer never dead-letters a message because the migration has not run yet."""
    v = verdict(
        onceonly.NotMigrated("run store.migrate() first"),
        stage=Stage.INBOX,
        delivery_count=99,
        max_deliveries=3,
        backoff=Backoff(0.1, 1.0),
        jitter=0.5,
    )
    assert v.action is Action.RETRY and not v.counted and v.reason == NOT_MIGRATED
