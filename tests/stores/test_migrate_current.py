# SPDX-License-Identifier: MIT
"""``migrate()`` on a schema that is already current issues no DDL.

A worker that restarts calls ``store.migrate()`` while the other workers run: their
transactions (an inbox batch, a handler idle in its transaction) hold locks on the
records table. DDL on it (PostgreSQL's ``CREATE INDEX IF NOT EXISTS`` takes a SHARE
lock even when the index exists; the outbox trigger's ``DROP``/``CREATE`` likewise)
would wait for every one of them, and every statement behind it in the lock queue would
wait too. With the recorded schema version current, migrate reads that version and
returns.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import onceonly
from tests.conftest import (
    MYSQL_URL,
    PG_URL,
    drop_mysql_table,
    drop_pg_table,
    require_mysql,
    require_postgres,
    unique_table,
)

pytestmark = pytest.mark.timeout(60)


class _Holder:
    """A transaction held open on another connection, as a running batch holds one."""

    def __init__(self, begin: Callable[[], Any]) -> None:
        self._begin = begin
        self._release = threading.Event()
        self._ready = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Holder:
        self._thread.start()
        assert self._ready.wait(10), self.error
        if self.error is not None:
            raise self.error
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self._thread.join(10)

    def _run(self) -> None:
        try:
            end = self._begin()
        except BaseException as exc:
            self.error = exc
            self._ready.set()
            return
        self._ready.set()
        self._release.wait(30)
        end()


def _pg_hold(table: str, outbox: str) -> Callable[[], Any]:
    def begin() -> Callable[[], None]:
        import psycopg

        conn = psycopg.connect(PG_URL)  # a transaction opens with the first statement
        # the lock every INSERT / UPDATE of a running batch holds until it ends
        conn.execute(f"LOCK TABLE {table}, {outbox} IN ROW EXCLUSIVE MODE")

        def end() -> None:
            conn.rollback()
            conn.close()

        return end

    return begin


def _mysql_hold(table: str, outbox: str) -> Callable[[], Any]:
    def begin() -> Callable[[], None]:
        import pymysql

        from onceonly.stores.mysql._sql import parse_url

        conn = pymysql.connect(**parse_url(MYSQL_URL), autocommit=False)
        cur = conn.cursor()  # a running batch: a row written, the transaction open
        cur.execute(
            f"INSERT INTO `{table}` (scope, `key`, state, token, attempts, created_at,"
            " updated_at) VALUES ('held', 'k', 'in_progress', 1, 0, 0, 0)"
        )
        cur.execute(f"SELECT * FROM `{outbox}` FOR UPDATE")

        def end() -> None:
            conn.rollback()
            conn.close()

        return end

    return begin


@pytest.fixture(params=["postgresql", "mysql"])
def backend(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, str]]:
    table = unique_table()
    outbox = f"{table}_out"
    if request.param == "postgresql":
        require_postgres()
        yield PG_URL, table, outbox
        drop_pg_table(table)
        drop_pg_table(outbox)
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP FUNCTION IF EXISTS {outbox}_notify()")
            conn.execute("DELETE FROM onceonly_schema WHERE component = %s", (f"outbox:{outbox}",))
    else:
        require_mysql()
        yield MYSQL_URL, table, outbox
        drop_mysql_table(table, outbox)


async def test_migrate_of_a_current_schema_does_not_wait_for_open_transactions(
    backend: tuple[str, str, str],
) -> None:
    url, table, outbox = backend
    store = onceonly.open_async_store(url, table=table, outbox_table=outbox)
    try:
        await store.migrate()
    finally:
        await store.close()
    hold = _pg_hold(table, outbox) if url == PG_URL else _mysql_hold(table, outbox)
    with _Holder(hold):
        # a restarting worker: a new store, migrate() before it consumes
        again = onceonly.open_async_store(url, table=table, outbox_table=outbox)
        try:
            start = time.monotonic()
            await asyncio.wait_for(again.migrate(), 10)
            took = time.monotonic() - start
            assert await again.schema_version() == 1
        finally:
            await again.close()
    assert took < 1.0, f"migrate() of a current schema waited {took:.1f} s"


def test_sync_migrate_of_a_current_schema_does_not_wait(
    backend: tuple[str, str, str],
) -> None:
    url, table, outbox = backend
    with onceonly.open_store(url, table=table, outbox_table=outbox) as store:
        store.migrate()
    hold = _pg_hold(table, outbox) if url == PG_URL else _mysql_hold(table, outbox)
    with _Holder(hold), onceonly.open_store(url, table=table, outbox_table=outbox) as again:
        done = threading.Event()
        took: list[float] = []

        def run() -> None:
            start = time.monotonic()
            again.migrate()
            took.append(time.monotonic() - start)
            done.set()

        threading.Thread(target=run, daemon=True).start()
        assert done.wait(10), "migrate() of a current schema waited for the open transaction"
    assert took[0] < 1.0, f"migrate() of a current schema waited {took[0]:.1f} s"


async def test_migrate_creates_a_table_dropped_since_it_was_recorded(
    backend: tuple[str, str, str],
) -> None:
    """The version row alone does not skip the DDL: a records or outbox table dropped by
    hand (its row left behind) is created again."""
    url, table, outbox = backend
    store = onceonly.open_async_store(url, table=table, outbox_table=outbox)
    try:
        await store.migrate()
        for dropped in (table, outbox):
            _drop_table_only(url, dropped)
            await store.migrate()
            async with store.transaction() as tx:
                cur = await tx.execute(f"SELECT count(*) FROM {dropped}")
                assert (await cur.fetchone())[0] == 0
    finally:
        await store.close()


def _drop_table_only(url: str, table: str) -> None:
    """DROP TABLE by hand, leaving its schema row."""
    if url == PG_URL:
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP TABLE {table}")
        return
    import pymysql

    from onceonly.stores.mysql._sql import parse_url

    conn = pymysql.connect(**parse_url(MYSQL_URL), autocommit=True)
    try:
        conn.cursor().execute(f"DROP TABLE `{table}`")
    finally:
        conn.close()
