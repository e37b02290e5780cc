# SPDX-License-Identifier: MIT
"""The partitioned PostgreSQL layout at its edges: a purge that meets a partition
dropped under it carries on, and a psycopg2-joined store refuses another isolation
level with the same ConfigurationError as psycopg 3 (docs/errors.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import psycopg2
import pytest

import onceonly
from onceonly import ConfigurationError, Inbox
from tests.conftest import PG_URL, drop_pg_table, require_postgres, unique_table


@pytest.fixture
def table() -> Iterator[str]:
    require_postgres()
    name = unique_table()
    yield name
    drop_pg_table(name)


def _sql(query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        cur = conn.execute(query)
        return cur.fetchall() if cur.description else []


def test_purge_carries_on_past_a_partition_dropped_under_it(table: str) -> None:
    """A partition dropped between the purge's listing and its DELETE is skipped."""
    store = onceonly.open_store(PG_URL, table=table, outbox_table=None)
    try:
        store.migrate(partitioned=True, period=timedelta(hours=1), ahead=3)
        inbox = Inbox(store, "c", ttl=0.01)
        for n in range(5):
            inbox.process(f"k{n}", {}, lambda p, tx: 1)
        time.sleep(0.05)
        leaves = [
            r[0]
            for r in _sql(
                f"SELECT relid::regclass::text FROM pg_partition_tree('{table}') WHERE isleaf"
            )
        ]
        assert len(leaves) >= 3 and leaves[0].endswith("_pdefault"), leaves
        # not the default partition: dropping a partition locks that one too
        first, doomed = leaves[1], leaves[-1]  # the last: a future, empty partition
        errors: list[BaseException] = []
        reports: list[Any] = []
        with psycopg.connect(PG_URL) as holder:
            holder.execute(f"LOCK TABLE {first} IN EXCLUSIVE MODE")  # DELETE waits, reads do not

            def purge() -> None:
                try:
                    reports.append(onceonly.Admin(store).purge())
                except BaseException as exc:
                    errors.append(exc)

            worker = threading.Thread(target=purge)
            worker.start()
            deadline = time.monotonic() + 10
            while not _sql(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                f" AND query LIKE 'DELETE FROM {first}%'"
            ):
                assert time.monotonic() < deadline, _sql(
                    "SELECT wait_event_type, left(query, 120) FROM pg_stat_activity"
                    " WHERE state <> 'idle'"
                )
                time.sleep(0.02)
            _sql(f"DROP TABLE {doomed}")  # what drop_expired() does, under the purge
            holder.commit()
            worker.join(10)
        assert errors == [], errors
        assert reports and reports[0].deleted == 5
    finally:
        store.close()


def test_psycopg2_joined_isolation_refusal_is_a_configuration_error(table: str) -> None:
    """REPEATABLE READ on a psycopg2 connection: ConfigurationError, never counted."""
    store = onceonly.open_store(PG_URL, table=table, outbox_table=None)
    try:
        store.migrate(partitioned=True)
        conn = psycopg2.connect(PG_URL)
        try:
            conn.set_session(isolation_level="REPEATABLE READ")
            with pytest.raises(ConfigurationError, match="READ COMMITTED"):
                Inbox(store, "c").process("k", {}, lambda p, tx: 1, connection=conn)
            conn.rollback()
        finally:
            conn.close()
        with store.session() as s:
            assert s.get("c", "k").record is None  # nothing stored, nothing counted
    finally:
        store.close()
