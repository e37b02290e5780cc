# SPDX-License-Identifier: MIT
"""What only the PostgreSQL store does: schema, locking, savepoints, error mapping.

Every test runs against a real server (``ONCEONLY_TEST_PG``, default the local ``test``
database) on a table of its own. An unreachable server skips locally and fails in CI.
Transaction tests run with the pipeline on and off (both ``BEGIN`` strategies).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import pq
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

import onceonly
from onceonly._core.state import Expect, State, Write
from onceonly.errors import (
    ConfigurationError,
    CorruptRecord,
    InFlight,
    OnceOnlyError,
    StoreError,
    StoreUnavailable,
    TransactionAborted,
)
from onceonly.stores.postgres import AsyncPostgresStore, PostgresStore

PG_URL = os.environ.get("ONCEONLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
SCOPE = "orders"


def claim_write(token: int = 7, *, lease: float = 30.0, fp: str = "fp-1") -> Write:
    return Write(State.IN_PROGRESS, token, fp, 0, lease_seconds=lease)


def done_write(token: int = 7, *, ttl: float | None = 3600.0) -> Write:
    return Write(State.COMPLETED, token, "fp-1", 0, result='"ok"', ttl_seconds=ttl, completed=True)


@pytest.fixture(scope="module")
def pg_url() -> str:
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        if IN_CI:
            pytest.fail(f"PostgreSQL at {PG_URL} is not reachable, and CI requires it: {exc}")
        pytest.skip(f"PostgreSQL at {PG_URL} is not reachable")
    return PG_URL


def admin(sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run ``sql`` on a separate autocommit connection; the rows, if any."""
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def tables(table: str) -> dict[str, str]:
    """The store options that keep a test's tables its own."""
    return {"table": table, "outbox_table": f"{table}_outbox"}


def drop(table: str) -> None:
    for name in (table, f"{table}_biz", f"{table}_outbox"):
        admin(f"DROP TABLE IF EXISTS {name}")
    admin(f"DROP FUNCTION IF EXISTS {table}_outbox_notify()")
    if admin("SELECT to_regclass('onceonly_schema')")[0][0]:
        admin(
            "DELETE FROM onceonly_schema WHERE component = ANY(%s)",
            ([f"records:{table}", f"outbox:{table}_outbox"],),
        )


@pytest.fixture
def table(pg_url: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    drop(name)


@pytest.fixture(params=[False, True], ids=["seq", "pipeline"])
def store(request: pytest.FixtureRequest, table: str) -> Iterator[PostgresStore]:
    s = PostgresStore(PG_URL, **tables(table), pipeline=request.param)
    s.migrate()
    admin(f"CREATE TABLE {table}_biz (id text)")
    yield s
    s.close()


@pytest.fixture(params=[False, True], ids=["seq", "pipeline"])
async def astore(request: pytest.FixtureRequest, table: str) -> AsyncIterator[AsyncPostgresStore]:
    s = AsyncPostgresStore(PG_URL, **tables(table), pipeline=request.param)
    await s.migrate()
    admin(f"CREATE TABLE {table}_biz (id text)")
    yield s
    await s.close()


def committed(table: str, key: str) -> list[tuple[Any, ...]]:
    return admin(f"SELECT state, token FROM {table} WHERE key = %s", (key,))


def wait_for_lock_waiter(table: str, timeout: float = 10.0) -> None:
    """Block until some backend waits on a lock in a statement that names ``table``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = admin(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE %s",
            (f"%{table}%",),
        )
        if rows[0][0]:
            return
        time.sleep(0.01)
    raise AssertionError("nobody started waiting for the lock")


# -- schema


def test_migrate_is_repeatable(table: str, pg_url: str) -> None:
    """migrate() twice creates the table, its index and check, and records version 1."""
    store = PostgresStore(pg_url, **tables(table))
    try:
        assert store.schema_version() is None
        store.migrate()
        store.migrate()
        assert store.schema_version() == 1
        assert admin(
            "SELECT component, version FROM onceonly_schema WHERE component = ANY(%s) "
            "ORDER BY component",
            ([f"records:{table}", f"outbox:{table}_outbox"],),
        ) == [(f"outbox:{table}_outbox", 1), (f"records:{table}", 1)]
        assert admin("SELECT to_regclass(%s) IS NOT NULL", (f"{table}_outbox",)) == [(True,)]
        cols = admin(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_name = %s ORDER BY ordinal_position",
            (table,),
        )
        assert [c for c, _ in cols] == [
            "scope", "key", "state", "fingerprint", "token", "attempts", "lease_until",
            "result", "error", "payload", "checkpoint", "created_at", "updated_at",
            "completed_at", "expires_at",
        ]  # fmt: skip
        assert dict(cols)["token"] == "bigint"
        assert dict(cols)["expires_at"] == "timestamp with time zone"
        indexes = admin("SELECT indexname FROM pg_indexes WHERE tablename = %s", (table,))
        assert sorted(indexes) == [(f"{table}_expires",), (f"{table}_pkey",)]
        with pytest.raises(psycopg.errors.CheckViolation):
            admin(f"INSERT INTO {table} (scope, key, state, token) VALUES ('s', 'k', 'paused', 1)")
    finally:
        store.close()


async def test_migrate_is_repeatable_async(table: str, pg_url: str) -> None:
    """The async store migrates twice too, and opens its pool lazily."""
    store = AsyncPostgresStore(pg_url, **tables(table))
    try:
        await store.migrate()
        await store.migrate()
        assert await store.schema_version() == 1
    finally:
        await store.close()


def test_migrate_concurrently_from_threads(pg_url: str) -> None:
    """Several processes' worth of stores migrating one new table at once all succeed."""
    for _ in range(3):
        name = f"t_{uuid.uuid4().hex[:12]}"
        stores = [PostgresStore(pg_url, **tables(name)) for _ in range(4)]
        barrier = threading.Barrier(len(stores))
        errors: list[BaseException] = []

        def run(s: PostgresStore, barrier: threading.Barrier, errors: list[BaseException]) -> None:
            barrier.wait()
            try:
                s.migrate()
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(s, barrier, errors)) for s in stores]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
            assert stores[0].schema_version() == 1
        finally:
            for s in stores:
                s.close()
            drop(name)


async def test_migrate_concurrently_async(table: str, pg_url: str) -> None:
    """Concurrent async migrations of one table succeed."""
    stores = [AsyncPostgresStore(pg_url, **tables(table)) for _ in range(3)]
    try:
        await asyncio.gather(*(s.migrate() for s in stores))
        assert await stores[0].schema_version() == 1
    finally:
        for s in stores:
            await s.close()


def test_newer_schema_is_refused(store: PostgresStore) -> None:
    """A table recorded with a newer schema version is not touched."""
    admin("UPDATE onceonly_schema SET version = 99 WHERE component = %s", (store._component,))
    with pytest.raises(ConfigurationError, match="schema version 99"):
        store.migrate()


def test_bad_table_name_is_refused(pg_url: str) -> None:
    """Table names are validated identifiers."""
    with pytest.raises(ConfigurationError):
        PostgresStore(pg_url, table="x; DROP TABLE y")


# -- claim


def test_claim_inserts_then_returns_existing(store: PostgresStore) -> None:
    """The first claim inserts (stamped by the database clock); the next sees that row."""
    with store.transaction() as s:
        first = s.claim(SCOPE, "k", claim_write(1))
        second = s.claim(SCOPE, "k", claim_write(2, fp="other"))
    assert first.inserted and not second.inserted
    rec = first.record
    assert rec is not None and rec.token == 1 and rec.state is State.IN_PROGRESS
    assert rec.created_at == rec.updated_at == first.now
    assert rec.lease_until == pytest.approx(first.now + 30.0, abs=1e-6)
    assert abs(first.now - time.time()) < 5  # same host: the clocks roughly agree
    assert second.record == rec  # the existing record, untouched by the second Write
    assert second.now >= first.now
    with store.session() as s:
        again = s.claim(SCOPE, "k", claim_write(3))
        assert not again.inserted and again.record == rec
        assert s.get(SCOPE, "k").record == rec
        assert s.get(SCOPE, "absent").record is None


async def test_claim_inserts_then_returns_existing_async(astore: AsyncPostgresStore) -> None:
    """The async claim inserts, then returns the existing row."""
    async with astore.transaction() as s:
        first = await s.claim(SCOPE, "k", claim_write(1))
    async with astore.transaction() as s:
        second = await s.claim(SCOPE, "k", claim_write(2))
    assert first.inserted and not second.inserted
    assert second.record == first.record
    async with astore.session() as s:
        assert (await s.get(SCOPE, "k")).record == first.record


def test_written_records_equal_what_is_read_back(store: PostgresStore) -> None:
    """Records of writes are computed, not read back; they must equal a later read."""
    with store.session() as s:
        for i, (lease, ttl) in enumerate([(0.1234567, 1.0000005), (2.5e-6, 86400.0 * 7)]):
            key = f"k{i}"
            snap = s.claim(SCOPE, key, claim_write(1, lease=lease))
            assert snap.record == s.get(SCOPE, key).record
            updated = s.update(SCOPE, key, Expect.holder(1), done_write(1, ttl=ttl))
            assert updated is not None and updated == s.get(SCOPE, key).record
        inserted = s.insert(SCOPE, "k-ins", claim_write(5, lease=0.5))
        assert inserted is not None and inserted == s.get(SCOPE, "k-ins").record
        assert s.insert(SCOPE, "k-ins", claim_write(6)) is None


def test_concurrent_claim_waits_then_reports_in_flight(store: PostgresStore) -> None:
    """An uncommitted claim of the same key blocks another, up to lock_wait: InFlight."""
    outcome: dict[str, Any] = {}

    def second() -> None:
        start = time.monotonic()
        try:
            with store.transaction(lock_wait=0.3) as b:
                outcome["snap"] = b.claim(SCOPE, "k", claim_write(2))
        except BaseException as exc:  # checked below
            outcome["error"] = exc
        outcome["elapsed"] = time.monotonic() - start

    with store.transaction() as a:
        assert a.claim(SCOPE, "k", claim_write(1)).inserted
        thread = threading.Thread(target=second)
        thread.start()
        thread.join(5)  # an unbounded wait would only end when this transaction does
        assert not thread.is_alive(), "the claim was not bounded by lock_wait"
    thread.join()
    error = outcome.get("error")
    assert isinstance(error, InFlight), outcome
    assert 0.25 <= outcome["elapsed"] < 2.5
    assert error.key == "k" and error.scope == SCOPE
    assert isinstance(error.__cause__, psycopg.errors.LockNotAvailable)
    assert committed(store.table, "k") == [("in_progress", 1)]
    with store.transaction(lock_wait=0.3) as b:  # the pool's connections are still good
        assert not b.claim(SCOPE, "k", claim_write(2)).inserted


async def test_concurrent_claim_reports_in_flight_async(astore: AsyncPostgresStore) -> None:
    """The async claim is bounded by lock_wait as well."""
    async with astore.transaction() as a:
        await a.claim(SCOPE, "k", claim_write(1))
        start = time.monotonic()
        with pytest.raises(InFlight):
            async with astore.transaction(lock_wait=0.3) as b:
                await asyncio.wait_for(b.claim(SCOPE, "k", claim_write(2)), 5)
        assert 0.25 <= time.monotonic() - start < 2.5


def test_update_of_a_locked_row_reports_in_flight(store: PostgresStore) -> None:
    """A fenced update waiting for another transaction's row lock is bounded too."""
    with store.session() as s:
        s.claim(SCOPE, "k", claim_write(1))
    with store.transaction() as a:
        assert (
            a.update(SCOPE, "k", Expect.holder(1), claim_write(2)) is not None
        )  # reclaim: holds the row
        outcome: list[BaseException] = []

        def second() -> None:
            try:
                with store.transaction(lock_wait=0.3) as b:
                    b.update(SCOPE, "k", Expect.holder(1), claim_write(3))
            except BaseException as exc:  # checked below
                outcome.append(exc)

        thread = threading.Thread(target=second)
        thread.start()
        thread.join(5)
        assert not thread.is_alive(), "the update was not bounded by lock_wait"
    thread.join()
    assert len(outcome) == 1 and isinstance(outcome[0], InFlight), outcome
    assert committed(store.table, "k") == [("in_progress", 2)]


def test_blocked_claim_returns_the_committed_row(store: PostgresStore) -> None:
    """When the first transaction commits, a claim that waited for it returns its row."""
    result: dict[str, Any] = {}

    def second() -> None:
        try:
            with store.transaction(lock_wait=30) as b:
                result["snap"] = b.claim(SCOPE, "k", claim_write(2))
        except BaseException as exc:  # reported below
            result["error"] = exc

    thread = threading.Thread(target=second)
    with store.transaction() as a:
        a.claim(SCOPE, "k", claim_write(1))
        thread.start()
        wait_for_lock_waiter(store.table)
    thread.join(10)
    assert "error" not in result, result.get("error")
    snap = result["snap"]
    assert not snap.inserted
    assert snap.record is not None and snap.record.token == 1


async def test_blocked_claim_returns_the_committed_row_async(astore: AsyncPostgresStore) -> None:
    """The async claim also falls back to reading the row committed while it waited."""

    async def second() -> Any:
        async with astore.transaction(lock_wait=30) as b:
            return await b.claim(SCOPE, "k", claim_write(2))

    async with astore.transaction() as a:
        await a.claim(SCOPE, "k", claim_write(1))
        task = asyncio.create_task(second())
        await asyncio.to_thread(wait_for_lock_waiter, astore.table)
    snap = await asyncio.wait_for(task, 10)
    assert not snap.inserted and snap.record.token == 1


def test_lock_timeout_is_restored_after_a_claim(store: PostgresStore) -> None:
    """The claim's lock_timeout does not leak into the caller's statements."""
    with store.transaction(lock_wait=0.3) as s:
        before = s.execute("SHOW lock_timeout").fetchone()
        s.claim(SCOPE, "k", claim_write(1))
        s.update(SCOPE, "other", Expect.holder(5), claim_write(6))  # bounded, and matches no row
        assert s.execute("SHOW lock_timeout").fetchone() == before
    with psycopg.connect(PG_URL) as caller:
        caller.execute("SET lock_timeout = '7s'")
        caller.execute("SELECT 1")
        with store.transaction(caller, lock_wait=0.3) as s:
            s.claim(SCOPE, "k2", claim_write(1))
            assert s.execute("SHOW lock_timeout").fetchone() == ("7s",)
        caller.rollback()


# -- fenced writes


def test_update_is_fenced_by_token(store: PostgresStore) -> None:
    """update() writes only over the expected token and stamps the times."""
    with store.transaction() as s:
        claimed = s.claim(SCOPE, "k", claim_write(1)).record
        assert claimed is not None
        assert s.update(SCOPE, "k", Expect.holder(999), done_write(2)) is None
        assert s.get(SCOPE, "k").record == claimed
        done = s.update(SCOPE, "k", Expect.holder(1), done_write(2, ttl=60.0))
    assert done is not None and done.state is State.COMPLETED and done.token == 2
    assert done.created_at == claimed.created_at and done.updated_at >= claimed.updated_at
    assert done.completed_at == done.updated_at and done.lease_until is None
    assert done.expires_at == pytest.approx(done.updated_at + 60.0, abs=1e-6)
    assert committed(store.table, "k") == [("completed", 2)]


def test_renew_and_checkpoint_are_fenced(store: PostgresStore) -> None:
    """renew() and save_checkpoint() need the current token and an in_progress record."""
    with store.session() as s:
        snap = s.claim(SCOPE, "k", claim_write(1, lease=5.0))
        assert snap.record is not None and snap.record.lease_until is not None
        assert s.renew(SCOPE, "k", 2, 60.0) is None
        assert s.save_checkpoint(SCOPE, "k", 2, "step-1") is False
        until = s.renew(SCOPE, "k", 1, 60.0)
        assert until is not None and until > snap.record.lease_until
        assert s.get(SCOPE, "k").record.lease_until == until  # type: ignore[union-attr]
        assert s.save_checkpoint(SCOPE, "k", 1, "step-1") is True
        assert s.get(SCOPE, "k").record.checkpoint == "step-1"  # type: ignore[union-attr]
        s.update(SCOPE, "k", Expect.holder(1), done_write(1))
        assert s.renew(SCOPE, "k", 1, 60.0) is None
        assert s.save_checkpoint(SCOPE, "k", 1, "step-2") is False
        assert s.renew(SCOPE, "absent", 1, 60.0) is None


async def test_renew_and_checkpoint_are_fenced_async(astore: AsyncPostgresStore) -> None:
    """The async renew/save_checkpoint are fenced the same way."""
    async with astore.session() as s:
        await s.claim(SCOPE, "k", claim_write(1))
        assert await s.renew(SCOPE, "k", 2, 60.0) is None
        assert await s.renew(SCOPE, "k", 1, 60.0) is not None
        assert await s.save_checkpoint(SCOPE, "k", 2, "x") is False
        assert await s.save_checkpoint(SCOPE, "k", 1, "x") is True
        await s.update(SCOPE, "k", Expect.holder(1), done_write(1))
        assert await s.renew(SCOPE, "k", 1, 60.0) is None


# -- transactions


def test_transaction_rolls_back_on_error(store: PostgresStore) -> None:
    """An exception undoes the claim and the caller's writes, even ones made first."""
    biz = f"{store.table}_biz"
    with pytest.raises(RuntimeError), store.transaction() as s:
        s.connection.execute(f"INSERT INTO {biz} VALUES ('before')")  # before our first op
        s.claim(SCOPE, "k", claim_write(1))
        s.execute(f"INSERT INTO {biz} VALUES (?)", ("after",))
        raise RuntimeError("boom")
    assert committed(store.table, "k") == []
    assert admin(f"SELECT count(*) FROM {biz}") == [(0,)]
    with store.transaction() as s:
        s.connection.execute(f"INSERT INTO {biz} VALUES ('before')")
        s.claim(SCOPE, "k", claim_write(1))
    assert committed(store.table, "k") == [("in_progress", 1)]
    assert admin(f"SELECT count(*) FROM {biz}") == [(1,)]


def test_failed_statement_is_never_reported_committed(store: PostgresStore) -> None:
    """A transaction whose statement failed (and was swallowed) raises and rolls back."""
    with pytest.raises(TransactionAborted, match="rolled back"), store.transaction() as s:
        s.claim(SCOPE, "k", claim_write(1))
        with pytest.raises(psycopg.errors.UndefinedTable):
            s.execute("SELECT * FROM no_such_table_here")
    assert committed(store.table, "k") == []


def test_joined_transaction_is_not_committed(store: PostgresStore) -> None:
    """A caller's transaction is joined in a savepoint: its rollback removes the record."""
    biz = f"{store.table}_biz"
    with psycopg.connect(PG_URL) as caller:
        caller.execute(f"INSERT INTO {biz} VALUES ('mine')")
        with store.transaction(caller) as s:
            assert s.connection is caller
            assert s.claim(SCOPE, "k", claim_write(1)).inserted
            s.execute(f"INSERT INTO {biz} VALUES (?)", ("handler",))
        assert caller.info.transaction_status == TransactionStatus.INTRANS
        assert committed(store.table, "k") == []  # not visible outside: not committed
        caller.rollback()
    assert committed(store.table, "k") == []
    assert admin(f"SELECT count(*) FROM {biz}") == [(0,)]
    with psycopg.connect(PG_URL) as caller:
        caller.execute("SELECT 1")
        with store.transaction(caller) as s:
            s.claim(SCOPE, "k", claim_write(1))
        caller.commit()
    assert committed(store.table, "k") == [("in_progress", 1)]


def test_joined_failure_rolls_back_to_the_savepoint(store: PostgresStore) -> None:
    """An error undoes only the session's work; the caller's transaction stays usable."""
    biz = f"{store.table}_biz"
    with psycopg.connect(PG_URL) as caller:
        caller.execute(f"INSERT INTO {biz} VALUES ('mine')")
        with pytest.raises(RuntimeError), store.transaction(caller) as s:
            s.claim(SCOPE, "k", claim_write(1))
            s.execute(f"INSERT INTO {biz} VALUES (?)", ("handler",))
            raise RuntimeError("boom")
        assert caller.info.transaction_status == TransactionStatus.INTRANS
        assert caller.execute(f"SELECT id FROM {biz}").fetchall() == [("mine",)]
        assert caller.execute(f"SELECT count(*) FROM {store.table}").fetchone() == (0,)
        caller.commit()


async def test_joined_transaction_async(astore: AsyncPostgresStore) -> None:
    """The async store joins an AsyncConnection's transaction without committing it."""
    async with await psycopg.AsyncConnection.connect(PG_URL) as caller:
        await caller.execute("SELECT 1")
        async with astore.transaction(caller) as s:
            await s.claim(SCOPE, "k", claim_write(1))
        assert caller.info.transaction_status == TransactionStatus.INTRANS
        assert committed(astore.table, "k") == []
        await caller.rollback()
    assert committed(astore.table, "k") == []


def test_joining_needs_an_open_transaction(store: PostgresStore) -> None:
    """A caller's connection in autocommit outside a transaction, or of the other flavour,
    is refused."""
    with (
        psycopg.connect(PG_URL, autocommit=True) as auto,
        pytest.raises(ConfigurationError, match="not inside a transaction"),
    ):
        store.transaction(auto)
    with psycopg.connect(PG_URL) as idle:
        idle.execute("SELECT 1")
        astore = AsyncPostgresStore(PG_URL, table=store.table, outbox_table=None)
        with pytest.raises(ConfigurationError, match="AsyncConnection"):
            astore.transaction(idle)  # type: ignore[arg-type]
        idle.rollback()


# -- SQL of the caller


def test_execute_translates_placeholders(store: PostgresStore) -> None:
    """execute() takes ``?`` placeholders; a literal % survives; no params: SQL as is."""
    with store.session() as s:
        assert s.execute("SELECT ?::int + ?", (1, 2)).fetchone() == (3,)
        assert s.execute("SELECT 'a%' || ?", ("b",)).fetchone() == ("a%b",)
        assert s.execute("""SELECT '{"a": 1}'::jsonb ? 'a'""").fetchone() == (True,)


async def test_execute_translates_placeholders_async(astore: AsyncPostgresStore) -> None:
    """The async execute() translates ``?`` too."""
    async with astore.transaction() as s:
        cur = await s.execute("SELECT ?::int * ?", (6, 7))
        assert await cur.fetchone() == (42,)


def test_caller_sql_errors_are_not_wrapped(store: PostgresStore) -> None:
    """Errors of the caller's own SQL reach the caller as psycopg raised them."""
    with store.session() as s, pytest.raises(psycopg.errors.UndefinedTable) as info:
        s.execute("SELECT * FROM no_such_table_here")
    assert not isinstance(info.value, OnceOnlyError)


# -- error mapping


def test_unknown_state_is_corrupt(store: PostgresStore) -> None:
    """A row with a state onceonly does not know raises CorruptRecord; it is left alone."""
    admin(f"ALTER TABLE {store.table} DROP CONSTRAINT {store.table}_state_check")
    admin(
        f"INSERT INTO {store.table} (scope, key, state, token) VALUES (%s, 'k', 'paused', 1)",
        (SCOPE,),
    )
    with store.session() as s:
        with pytest.raises(CorruptRecord) as info:
            s.get(SCOPE, "k")
        assert info.value.key == "k"
        with pytest.raises(CorruptRecord):
            s.claim(SCOPE, "k", claim_write(2))
    assert committed(store.table, "k") == [("paused", 1)]


def test_missing_table_is_a_store_error(table: str, pg_url: str) -> None:
    """Using the store before migrate() is a StoreError that says so (not transient)."""
    store = PostgresStore(pg_url, **tables(table))
    try:
        with store.session() as s, pytest.raises(StoreError, match="migrate") as info:
            s.get(SCOPE, "k")
        assert not isinstance(info.value, StoreUnavailable)
        assert isinstance(info.value, onceonly.NotMigrated)
        assert isinstance(info.value.__cause__, psycopg.errors.UndefinedTable)
    finally:
        store.close()


def test_killed_connection_is_store_unavailable(store: PostgresStore) -> None:
    """A connection terminated by the server maps to StoreUnavailable; the pool recovers."""
    with store.session() as s:
        admin("SELECT pg_terminate_backend(%s)", (s.connection.info.backend_pid,))
        with pytest.raises(StoreUnavailable) as info:
            s.get(SCOPE, "k")
        assert isinstance(info.value.__cause__, psycopg.OperationalError)
    with pytest.raises(StoreUnavailable), store.transaction() as s:
        s.claim(SCOPE, "k", claim_write(1))
        admin("SELECT pg_terminate_backend(%s)", (s.connection.info.backend_pid,))
        s.update(SCOPE, "k", Expect.holder(1), done_write(1))
    assert committed(store.table, "k") == []
    with store.session() as s:  # broken connections were discarded
        assert s.get(SCOPE, "k").record is None


async def test_killed_connection_is_store_unavailable_async(astore: AsyncPostgresStore) -> None:
    """The async store maps a terminated connection to StoreUnavailable too."""
    with pytest.raises(StoreUnavailable):
        async with astore.transaction() as s:
            await s.claim(SCOPE, "k", claim_write(1))
            admin("SELECT pg_terminate_backend(%s)", (s.connection.info.backend_pid,))
            await s.get(SCOPE, "k")
    async with astore.session() as s:
        assert (await s.get(SCOPE, "k")).record is None


def test_unreachable_server_is_store_unavailable(table: str) -> None:
    """No connection within the pool timeout is StoreUnavailable."""
    store = PostgresStore("postgresql://postgres@127.0.0.1:1/test", **tables(table), timeout=0.5)
    try:
        with pytest.raises(StoreUnavailable), store.session():
            pass
    finally:
        store.close()


def test_closed_store_is_a_store_error(store: PostgresStore) -> None:
    """A closed store refuses work with a StoreError."""
    store.close()
    with pytest.raises(StoreError, match="closed"), store.session():
        pass


# -- pools and round trips


def test_store_on_a_callers_pool(table: str, pg_url: str) -> None:
    """from_pool() uses the caller's pool, restores its settings and never closes it."""
    with ConnectionPool(pg_url, min_size=1, max_size=1, open=True) as pool:
        store = PostgresStore.from_pool(pool, table=table, outbox_table=None)
        store.migrate()
        with store.session() as s:
            s.claim(SCOPE, "k", claim_write(1))
        with store.transaction() as s:
            assert not s.claim(SCOPE, "k", claim_write(2)).inserted
        store.close()
        assert not pool.closed
        with pool.connection() as conn:
            assert conn.autocommit is False
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (1,)


def round_trips(conn: psycopg.Connection[Any], action: Any) -> int:
    """How many times ``action`` sent requests after reading replies (libpq trace)."""
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            action()
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        sides = [line.split("\t")[0] for line in trace.read().splitlines() if line]
    return sum(1 for i, side in enumerate(sides) if side == "F" and (i == 0 or sides[i - 1] != "F"))


def test_one_round_trip_per_operation(table: str, pg_url: str) -> None:
    """With the pipeline, BEGIN (or SAVEPOINT) rides with the first operation."""
    store = PostgresStore(pg_url, **tables(table), pipeline=True)
    try:
        store.migrate()
        with store.transaction() as s:
            c = s.connection
            assert round_trips(c, lambda: s.claim(SCOPE, "k", claim_write(1))) == 1
            assert (
                round_trips(c, lambda: s.update(SCOPE, "k", Expect.holder(1), done_write(1))) == 1
            )
            assert round_trips(c, lambda: s.get(SCOPE, "k")) == 1
        with store.session() as s:
            c = s.connection
            assert round_trips(c, lambda: s.claim(SCOPE, "k", claim_write(2))) == 1
            assert round_trips(c, lambda: s.renew(SCOPE, "k", 1, 5.0)) == 1
        with psycopg.connect(pg_url) as caller:
            caller.execute("SELECT 1")
            with store.transaction(caller) as s:
                assert round_trips(caller, lambda: s.claim(SCOPE, "k2", claim_write(1))) == 1
            caller.rollback()
    finally:
        store.close()


def test_joining_the_stores_own_transaction(store: PostgresStore) -> None:
    """A session's own connection can be joined (as the outbox does), even before BEGIN."""
    with pytest.raises(RuntimeError), store.transaction() as outer:
        with store.transaction(outer.connection) as inner:  # nothing sent on outer yet
            assert inner.claim(SCOPE, "k", claim_write(1)).inserted
        assert not outer.claim(SCOPE, "k", claim_write(2)).inserted
        raise RuntimeError("the outer transaction rolls back the joined work too")
    assert committed(store.table, "k") == []
    with store.transaction() as outer, store.transaction(outer.connection) as inner:
        inner.claim(SCOPE, "k", claim_write(1))
    assert committed(store.table, "k") == [("in_progress", 1)]


def test_a_lazily_begun_connection_is_joined(store: PostgresStore) -> None:
    """Autocommit off and nothing sent yet (Django's atomic()): joined without a dummy
    query; psycopg begins the transaction with the savepoint, the caller ends it."""
    with psycopg.connect(PG_URL) as lazy:
        assert lazy.info.transaction_status == TransactionStatus.IDLE
        with store.transaction(lazy) as s:
            s.claim(SCOPE, "k", claim_write(1))
        assert lazy.info.transaction_status == TransactionStatus.INTRANS
        assert committed(store.table, "k") == []
        lazy.commit()
    assert len(committed(store.table, "k")) == 1
