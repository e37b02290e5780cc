# SPDX-License-Identifier: MIT
"""A leased call inside an atomic handler on the same store, seen through a TieredStore.

docs/modes.md "A leased call inside an atomic handler": an ``@idempotent`` function called
from an atomic handler on the same store is refused at once with ``ConfigurationError``,
counted, "so it ends dead rather than coming back for ever". Wrapping either side in a
``TieredStore`` (same durable store, same SQLite connection pool) defeats the check: every
delivery waits for the SQLite busy timeout twice (~10 s) and raises an uncounted
``StoreUnavailable``, so a consumer retries it for ever (the bug the fix was for).
"""

from __future__ import annotations

import time

import pytest

import onceonly
from onceonly.stores.tiered import LocalTier, TieredStore


@pytest.mark.parametrize("wrapped", ["inbox", "decorator"])
def test_nested_idempotent_through_tiered_store_is_refused_at_once(tmp_path, wrapped):
    durable = onceonly.open_store(f"sqlite:///{tmp_path / 'n.db'}", migrate=True)
    tiered = TieredStore(durable, local=LocalTier(size=100, ttl=60))
    inbox_store, decorator_store = (tiered, durable) if wrapped == "inbox" else (durable, tiered)
    try:

        @onceonly.idempotent(decorator_store, key=lambda x: x, scope="atk.nested", wait=1)
        def effect(x):
            return x

        inbox = onceonly.Inbox(inbox_store, consumer="atk-nested", max_attempts=1)
        started = time.monotonic()
        with pytest.raises(onceonly.ConfigurationError):
            inbox.process("k", {}, lambda m, tx: effect("a"))
        assert time.monotonic() - started < 2.0, "not refused at once"
        # counted: with max_attempts=1 the key is now dead, not retried for ever
        with pytest.raises(onceonly.DeadLettered):
            inbox.process("k", {}, lambda m, tx: effect("a"))
    finally:
        durable.close()


def test_a_second_store_on_the_same_sqlite_file_is_refused_at_once(tmp_path):
    """Two open_store() calls on one SQLite file share its single writer: refused."""
    url = f"sqlite:///{tmp_path / 'n.db'}"
    first = onceonly.open_store(url, migrate=True)
    second = onceonly.open_store(url)
    try:

        @onceonly.idempotent(second, key=lambda x: x, scope="nested.file", wait=1)
        def effect(x):
            return x

        inbox = onceonly.Inbox(first, consumer="nested-file", max_attempts=1)
        started = time.monotonic()
        with pytest.raises(onceonly.ConfigurationError):
            inbox.process("k", {}, lambda m, tx: effect("a"))
        assert time.monotonic() - started < 2.0, "not refused at once"
    finally:
        second.close()
        first.close()


def test_a_second_postgres_store_has_its_own_pool_and_is_allowed(pg_store_factory):
    """Another open_store() on PostgreSQL has a pool of its own: the nested call runs."""
    first = pg_store_factory()
    first.migrate()
    second = onceonly.open_store(pg_store_factory.url, table=pg_store_factory.table)
    try:

        @onceonly.idempotent(second, key=lambda x: x, scope="nested.pg", wait=1)
        def effect(x):
            return x

        inbox = onceonly.Inbox(first, consumer="nested-pg", max_attempts=1)
        assert inbox.process("k", {}, lambda m, tx: effect("a")).result == "a"
    finally:
        second.close()
