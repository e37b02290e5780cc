# SPDX-License-Identifier: MIT
"""``onceonly doctor`` tells how PostgreSQL is reached: directly, through session pooling,
through transaction pooling (real PgBouncer instances, ``scripts/services pgbouncer``),
and the two-connection checks under it."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

import onceonly
from onceonly.cli._checks import check_store
from onceonly.stores.postgres._pool import behind_pooler, transaction_pooling
from tests.cli.test_records_cli import onceonly_cli
from tests.conftest import (
    PG_URL,
    PGBOUNCER_SESSION_URL,
    PGBOUNCER_URL,
    drop_pg_table,
    require_pgbouncer,
    require_postgres,
    unique_table,
)

URLS = {"direct": PG_URL, "session": PGBOUNCER_SESSION_URL, "transaction": PGBOUNCER_URL}
# what `onceonly doctor` prints for each
SEEN = {
    "direct": "ok    pooling: a direct connection to PostgreSQL (no pooler)",
    "session": "ok    pooling: a connection pooler in session mode",
    "transaction": "ok    pooling: transaction pooling (PgBouncer pool_mode=transaction",
}


@pytest.fixture
def table() -> Iterator[str]:
    require_postgres()
    require_pgbouncer(PGBOUNCER_URL)
    require_pgbouncer(PGBOUNCER_SESSION_URL)
    name = unique_table()
    store = onceonly.open_store(PG_URL, table=name, outbox_table=None)
    store.migrate()
    store.close()
    yield name
    drop_pg_table(name)


@pytest.mark.parametrize("how", list(URLS))
def test_doctor_classifies_how_postgres_is_reached(table: str, how: str) -> None:
    """doctor says direct, session pooling or transaction pooling, each where it is, and
    passes (the store adapts to each)."""
    done = onceonly_cli("doctor", "--url", URLS[how], "--table", table)
    assert done.returncode == 0, done.stdout
    lines = [line for line in done.stdout.splitlines() if "pooling:" in line]
    assert len(lines) == 1 and lines[0].startswith(SEEN[how]), done.stdout


def test_doctor_fails_a_preparing_store_behind_transaction_pooling(table: str) -> None:
    """A store forced to prepare (prepare=True) behind transaction pooling is a problem."""
    for url, ok in ((PGBOUNCER_URL, False), (PGBOUNCER_SESSION_URL, True), (PG_URL, True)):
        store = onceonly.open_store(url, table=table, outbox_table=None, prepare=True)
        try:
            (pooling,) = [f for f in check_store(store) if f.check == "pooling"]
        finally:
            store.close()
        assert pooling.ok is ok, (url, pooling)
        if not ok:
            assert "prepare=True" in pooling.what and "max_prepared_statements" in pooling.fix


@pytest.mark.parametrize("how", list(URLS))
def test_two_connection_checks(how: str) -> None:
    """behind_pooler and transaction_pooling on raw psycopg connections, 5 times each (a
    pooler classified by chance would show)."""
    require_pgbouncer(PGBOUNCER_URL)
    require_pgbouncer(PGBOUNCER_SESSION_URL)
    url = URLS[how]
    for _ in range(5):
        with (
            psycopg.connect(url, autocommit=True, prepare_threshold=None) as a,
            psycopg.connect(url, autocommit=True, prepare_threshold=None) as b,
        ):
            assert behind_pooler(a) is (how != "direct")
            assert transaction_pooling(a, b) is (how == "transaction")
            assert not a.info.transaction_status and not b.info.transaction_status
