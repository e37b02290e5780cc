# SPDX-License-Identifier: MIT
"""What the rest of the library needs of a store is a member of the store contract
(:mod:`onceonly.types`), on every store: its dialect, its schema version, its operator
side, its outbox statements, the translation of its driver's errors, its pool's size and
an outbox relay's wake-ups."""

from __future__ import annotations

from typing import Any

import pytest

import onceonly
from onceonly.errors import ConfigurationError, NotMigrated, StoreUnavailable
from onceonly.types import OutboxStatements

SQL = {"sqlite", "postgresql", "mysql"}


def test_sync_store_contract(leased_store: Any) -> None:
    """Every member answers, with what the store is."""
    store = leased_store
    assert store.dialect in {*SQL, "memory", "redis"}
    assert store.schema_version() == store.latest_schema_version
    assert (store.latest_schema_version is None) == (store.dialect not in SQL)
    assert store.pool_size is None or store.pool_size >= 1
    assert store.translate(ValueError("not a driver's")) is None
    store.renew_connections()
    if store.dialect not in SQL:
        assert store.outbox_table is None
        with pytest.raises(ConfigurationError, match="needs a SQL store"):
            store.outbox_statements("t_outbox")
    else:
        sql: OutboxStatements = store.outbox_statements("t_outbox")
        assert sql.table == "t_outbox" and sql.migrate() and sql.drop()
        with pytest.raises(ConfigurationError):
            store.outbox_statements("no such;table")
    if store.dialect != "postgresql":
        assert store.listen("t_outbox") is None
    if store.dialect == "redis":
        with pytest.raises(ConfigurationError, match="no operator access"):
            store.admin()
        with pytest.raises(ConfigurationError, match="no operator access"):
            onceonly.Admin(store)
    else:
        scopes, now = store.admin().stats()
        assert scopes == [] and now > 0


def test_a_driver_error_is_translated_by_its_store(sql_store: Any) -> None:
    """``translate`` maps an error of SQL run through a session: a missing table is
    NotMigrated."""
    with pytest.raises(Exception) as caught, sql_store.session() as s:
        s.execute("SELECT * FROM onceonly_no_such_table")
    assert not isinstance(caught.value, onceonly.OnceOnlyError)  # the driver's own
    assert isinstance(sql_store.translate(caught.value), NotMigrated)


def test_postgres_read_only_is_a_failover_for_the_outbox(pg_store_factory: Any) -> None:
    """A write refused in a read-only transaction of the store's own means a standby (a
    failover): transient for the outbox's statements, as for a relay."""
    store = pg_store_factory()
    store.migrate()
    with pytest.raises(Exception) as caught, store.transaction() as s:
        s.execute("SET TRANSACTION READ ONLY")
        s.execute(f"DELETE FROM {store.outbox_table}")
    assert not isinstance(caught.value, onceonly.OnceOnlyError)  # the driver's own
    assert isinstance(store.translate(caught.value), StoreUnavailable)


async def test_async_store_contract(leased_async_store: Any) -> None:
    """The async members answer as the sync ones do."""
    store = leased_async_store
    assert store.dialect in {*SQL, "memory", "redis"}
    assert await store.schema_version() == store.latest_schema_version
    assert store.translate(ValueError("not a driver's")) is None
    await store.renew_connections()
    if store.dialect != "postgresql":
        assert await store.listen("t_outbox") is None
    if store.dialect == "redis":
        with pytest.raises(ConfigurationError, match="no operator access"):
            store.admin()
        with pytest.raises(ConfigurationError, match="needs a SQL store"):
            onceonly.AsyncOutbox(store)
    else:
        scopes, now = await store.admin().stats()
        assert scopes == [] and now > 0
    with pytest.raises(ConfigurationError, match="is an async store"):
        onceonly.Admin(store)
