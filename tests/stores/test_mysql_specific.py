# SPDX-License-Identifier: MIT
"""What only the MariaDB/MySQL store does: URLs, lock-wait bounds, exact keys, joining a
caller's PyMySQL/aiomysql transaction, concurrent migrations, unreachable servers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly._core.state import State, Write
from onceonly._runtime import new_token
from onceonly.stores.mysql._sql import lock_wait_seconds, parse_url
from tests.conftest import (
    MYSQL_URL,
    StoreFactory,
    _mysql_connect,
    drop_mysql_table,
    require_mysql,
    unique_table,
)


@pytest.fixture
def mysql(tmp_path: Path) -> Iterator[StoreFactory]:
    factory = StoreFactory("mysql", tmp_path)
    yield factory
    factory.close()


def _claim(key: str) -> Write:
    return Write(State.IN_PROGRESS, new_token(), "fp", 0, lease_seconds=30)


def test_url_is_parsed_and_checked() -> None:
    args = parse_url("mariadb://u%40x:p%2Fw@db.example:3307/app?unix_socket=/run/m.sock")
    assert (args["user"], args["password"], args["host"], args["port"]) == (
        "u@x",
        "p/w",
        "db.example",
        3307,
    )
    assert (args["database"], args["unix_socket"]) == ("app", "/run/m.sock")
    for bad in ("mysql://host", "mysql://host/db?pool=3", "mysql://host:x/db", "pg://h/db"):
        with pytest.raises(onceonly.ConfigurationError):
            parse_url(bad)


def test_open_store_refuses_unknown_options() -> None:
    with pytest.raises(onceonly.ConfigurationError, match=r"valid options: .*max_size"):
        onceonly.open_store("mysql://root@127.0.0.1/test", pool_size=3)
    with pytest.raises(onceonly.ConfigurationError, match="valid options"):
        onceonly.open_async_store("mariadb://root@127.0.0.1/test", bogus=1)


def test_lock_wait_is_whole_seconds() -> None:
    assert [lock_wait_seconds(w) for w in (0, 0.3, 1, 1.5)] == [0, 1, 1, 2]
    assert lock_wait_seconds(float("inf")) > 10**8
    for bad in (float("nan"), -1):
        with pytest.raises(onceonly.ConfigurationError):
            lock_wait_seconds(bad)


def test_unreachable_server_is_store_unavailable() -> None:
    store = onceonly.open_store("mysql://root:secret@127.0.0.1:1/test", connect_timeout=2)
    with pytest.raises(onceonly.StoreUnavailable, match=r"127\.0\.0\.1:1") as info:
        store.migrate()
    assert "secret" not in str(info.value)
    store.close()


def test_keys_compare_byte_for_byte(mysql: StoreFactory) -> None:
    """No collation folds case or ignores trailing spaces: each key is its own record."""
    store = mysql()
    store.migrate()
    inbox = onceonly.Inbox(store, consumer="c")
    keys = ["a", "A", "a ", "ä", "a\u0308"]
    for i, key in enumerate(keys):
        assert inbox.process(key, {}, lambda p, tx, i=i: i).result == i
    assert [inbox.process(k, {}, lambda p, tx: -1).result for k in keys] == [0, 1, 2, 3, 4]


def test_migrate_concurrently_and_repeatedly(mysql: StoreFactory) -> None:
    stores = [mysql() for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda s: s.migrate(), stores))
    stores[0].migrate()
    assert stores[0].schema_version() == 1


def test_schema_version_before_migrate(mysql: StoreFactory) -> None:
    assert mysql().schema_version() is None


def test_uncommitted_claim_blocks_a_duplicate_for_lock_wait(mysql: StoreFactory) -> None:
    """A claim waits for a concurrent uncommitted claim of the key, up to lock_wait."""
    store = mysql()
    store.migrate()
    holding, release = threading.Event(), threading.Event()

    def first() -> None:
        with store.transaction() as a:
            assert a.claim("s", "k", _claim("k")).inserted
            holding.set()
            release.wait(20)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert holding.wait(10)
        started = time.monotonic()
        with pytest.raises(onceonly.InFlight), store.transaction(lock_wait=1) as b:
            b.claim("s", "k", _claim("k"))
        assert 0.9 < time.monotonic() - started < 5
    finally:
        release.set()
        thread.join(20)
    with store.transaction(lock_wait=1) as c:  # committed now: seen, not inserted again
        snap = c.claim("s", "k", _claim("k"))
    assert not snap.inserted and snap.record is not None


def test_waiting_claim_sees_the_commit_it_waited_for(mysql: StoreFactory) -> None:
    store = mysql()
    store.migrate()
    holding = threading.Event()
    first_token = new_token()

    def first() -> None:
        with store.transaction() as a:
            a.claim("s", "k", Write(State.IN_PROGRESS, first_token, "fp", 0, lease_seconds=30))
            holding.set()
            time.sleep(0.5)

    thread = threading.Thread(target=first)
    thread.start()
    assert holding.wait(10)
    with store.transaction(lock_wait=10) as b:
        snap = b.claim("s", "k", _claim("k"))
    thread.join(10)
    assert not snap.inserted
    assert snap.record is not None and snap.record.token == first_token


@pytest.fixture
def caller(mysql: StoreFactory) -> Iterator[tuple[Any, Any]]:
    """A store and the caller's own PyMySQL connection with a business table."""
    store = mysql()
    store.migrate()
    conn = _mysql_connect()
    conn.cursor().execute(f"CREATE TABLE `{mysql.table}_ledger` (id VARCHAR(20))")
    yield store, conn
    conn.close()


def _count(conn: Any, table: str) -> int:
    cur = conn.cursor()
    cur.execute(f"SELECT count(*) FROM `{table}_ledger`")
    return int(cur.fetchone()[0])


def test_joined_claim_rolls_back_with_the_caller(caller: tuple[Any, Any]) -> None:
    store, conn = caller
    inbox = onceonly.Inbox(store, consumer="c")
    conn.begin()
    conn.cursor().execute(f"INSERT INTO `{store.table}_ledger` VALUES ('mine')")

    def handler(p: Any, tx: onceonly.Tx) -> int:
        tx.execute(f"INSERT INTO `{store.table}_ledger` VALUES (?)", ("handler",))
        return 1

    assert inbox.process("k", {}, handler, connection=conn).replayed is False
    assert conn.get_autocommit() is False or conn.server_status & 1  # still open
    conn.rollback()
    assert _count(conn, store.table) == 0
    assert inbox.process("k", {}, lambda p, tx: 2).result == 2  # the claim was undone too


def test_joined_claim_commits_with_the_caller(caller: tuple[Any, Any]) -> None:
    store, conn = caller
    inbox = onceonly.Inbox(store, consumer="c")
    conn.begin()
    inbox.process("k", {}, lambda p, tx: "done", connection=conn)
    conn.commit()
    assert inbox.process("k", {}, lambda p, tx: "other").result == "done"


def test_joined_failure_rolls_back_to_the_savepoint(caller: tuple[Any, Any]) -> None:
    store, conn = caller
    inbox = onceonly.Inbox(store, consumer="c")
    conn.begin()
    conn.cursor().execute(f"INSERT INTO `{store.table}_ledger` VALUES ('mine')")

    def bad(p: Any, tx: onceonly.Tx) -> None:
        tx.execute(f"INSERT INTO `{store.table}_ledger` VALUES (?)", ("handler",))
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        inbox.process("k", {}, bad, connection=conn)
    conn.commit()
    cur = conn.cursor()
    cur.execute(f"SELECT id FROM `{store.table}_ledger`")
    assert [r[0] for r in cur.fetchall()] == ["mine"]


def test_joining_an_autocommit_connection_is_refused(caller: tuple[Any, Any]) -> None:
    store, conn = caller
    inbox = onceonly.Inbox(store, consumer="c")
    with pytest.raises(onceonly.ConfigurationError, match="not inside a transaction"):
        inbox.process("k", {}, lambda p, tx: 1, connection=conn)
    with pytest.raises(onceonly.ConfigurationError, match="expected a pymysql"):
        inbox.process("k", {}, lambda p, tx: 1, connection=object())


async def test_async_joins_an_aiomysql_transaction() -> None:
    import aiomysql

    require_mysql()
    table = unique_table()
    store = onceonly.open_async_store(MYSQL_URL, table=table, outbox_table=None)
    await store.migrate()
    args = parse_url(MYSQL_URL)
    conn = await aiomysql.connect(
        host=args["host"], port=args["port"], user=args["user"], password=args["password"],
        db=args["database"], autocommit=True,
    )  # fmt: skip
    try:
        inbox = onceonly.AsyncInbox(store, consumer="c")

        async def handler(p: Any, tx: onceonly.AsyncTx) -> int:
            return 1

        await conn.begin()
        assert (await inbox.process("k", {}, handler, connection=conn)).result == 1
        await conn.rollback()
        assert (await inbox.process("k", {}, handler)).replayed is False  # undone
        await conn.begin()
        await inbox.process("j", {}, handler, connection=conn)
        await conn.commit()
        assert (await inbox.process("j", {}, handler)).replayed is True
    finally:
        conn.close()
        await store.close()
        drop_mysql_table(table)


def test_the_mysql_claim_path_inserts_and_reads_back(mysql: StoreFactory) -> None:
    """MySQL has no INSERT … RETURNING: its claim is the insert plus a locking read (run
    here on MariaDB, which takes the same SQL)."""
    store = mysql()
    store.migrate()
    assert store._mariadb  # detected on the first connection
    store._mariadb = False
    write = _claim("k")
    with store.transaction() as s:
        first = s.claim("s", "k", write)
    assert first.inserted and first.record is not None and first.record.token == write.token
    with store.session() as s:
        again = s.claim("s", "k", _claim("k"))
    assert not again.inserted and again.record == first.record
    inbox = onceonly.Inbox(store, consumer="c")
    assert inbox.process("m", {}, lambda p, tx: 1).result == 1
    assert inbox.process("m", {}, lambda p, tx: 2).replayed


def test_nested_joins_keep_their_own_savepoints(caller: tuple[Any, Any]) -> None:
    """A handler that processes another message on the same connection: each join has a
    savepoint of its own (MySQL would replace one of the same name)."""
    store, conn = caller
    outer, inner = onceonly.Inbox(store, consumer="outer"), onceonly.Inbox(store, consumer="in")

    def handler(p: Any, tx: onceonly.Tx) -> int:
        assert inner.process("k", {}, lambda p, tx: 1, connection=tx.connection).result == 1
        return 2

    conn.begin()
    assert outer.process("k", {}, handler, connection=conn).result == 2
    conn.commit()
    assert outer.process("k", {}, handler).replayed
    assert inner.process("k", {}, lambda p, tx: 3).replayed


async def test_a_cancelled_transaction_leaves_the_pool_usable() -> None:
    import asyncio

    require_mysql()
    table = unique_table()
    store = onceonly.open_async_store(MYSQL_URL, table=table, outbox_table=None, max_size=2)
    await store.migrate()
    inbox = onceonly.AsyncInbox(store, consumer="c")

    async def slow(p: Any, tx: onceonly.AsyncTx) -> int:
        await tx.execute("SELECT SLEEP(2)")
        return 1

    async def quick(p: Any, tx: onceonly.AsyncTx) -> int:
        return 2

    try:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(inbox.process("k", {}, slow), 0.3)
        for i in range(3):  # no connection left mid-statement in the pool
            assert (await inbox.process(f"q{i}", {}, quick)).result == 2
        assert (await inbox.process("k", {}, quick)).result == 2  # the cut run was undone
    finally:
        await store.close()
        drop_mysql_table(table)


async def test_async_relay_and_outbox_on_mariadb() -> None:
    """AsyncRelay publishes rows written through AsyncInbox's tx.publish (aiomysql)."""
    import asyncio

    from onceonly.testing import AsyncListPublisher

    require_mysql()
    table = unique_table()
    store = onceonly.open_async_store(MYSQL_URL, table=table, outbox_table=f"{table}_outbox")
    try:
        await store.migrate()
        inbox = onceonly.AsyncInbox(store, consumer="c")

        async def handler(payload: Any, tx: onceonly.AsyncTx) -> str:
            return await tx.publish("topic", payload, key="same")

        ids = [(await inbox.process(f"k{i}", {"i": i}, handler)).result for i in range(5)]
        outbox = onceonly.AsyncOutbox(store)
        assert await outbox.counts() == {"pending": 5, "dead": 0}
        pub = AsyncListPublisher()
        relay = onceonly.AsyncRelay(store, pub, poll_interval=0.05, batch_size=2)
        task = asyncio.ensure_future(relay.run())
        for _ in range(200):
            if len(pub.messages) == 5:
                break
            await asyncio.sleep(0.02)
        relay.stop()
        stats = await asyncio.wait_for(task, 10)
        assert [m.id for m in pub.messages] == ids  # one relay: in insert order
        assert stats.published == 5
        assert await outbox.counts() == {"pending": 0, "dead": 0}
    finally:
        await store.close()
        drop_mysql_table(table, f"{table}_outbox")
