# SPDX-License-Identifier: MIT
"""`onceonly migrate --partitioned` and `onceonly records partitions`, run as the
installed console script against the real PostgreSQL."""

from __future__ import annotations

import time
from pathlib import Path

import onceonly
from tests.cli.test_records_cli import onceonly_cli
from tests.conftest import PG_URL
from tests.stores import test_partitioned

table = test_partitioned.table  # the fixture: a fresh table name, dropped after the test


def test_migrate_partitioned_then_list_ensure_and_drop(table: str) -> None:
    common = ("--url", PG_URL, "--table", table)
    done = onceonly_cli("migrate", *common, "--partitioned", "--period", "1s")
    assert done.returncode == 0, done.stderr
    listed = onceonly_cli("records", "partitions", *common)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].startswith(f"{table}_pdefault  DEFAULT")
    assert len(lines) == 5  # DEFAULT, the current second and 3 ahead
    done = onceonly_cli("records", "partitions", *common, "--ensure", "--ahead", "30")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("created ")
    store = onceonly.open_store(PG_URL, table=table, outbox_table=None)
    try:
        onceonly.Inbox(store, "c", ttl=0.1).process("k", {}, lambda p, tx: 1)
    finally:
        store.close()
    time.sleep(1.2)
    dry = onceonly_cli("records", "partitions", *common, "--drop-expired", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("would drop ")
    done = onceonly_cli("records", "partitions", *common, "--drop-expired")
    assert done.returncode == 0, done.stderr
    dropped = int(done.stdout.split()[1])
    assert dropped >= 1
    assert len(onceonly_cli("records", "partitions", *common).stdout.splitlines()) < 36


def test_partitions_on_sqlite_is_a_usage_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    assert onceonly_cli("migrate", "--url", url).returncode == 0
    done = onceonly_cli("records", "partitions", "--url", url)
    assert done.returncode == 2
    assert "only on PostgreSQL" in done.stderr
    done = onceonly_cli("migrate", "--url", url, "--partitioned")
    assert done.returncode == 2 and "PostgreSQL" in done.stderr


def test_partitions_help_names_every_option() -> None:
    done = onceonly_cli("records", "partitions", "--help")
    assert done.returncode == 0
    for option in ("--ensure", "--drop-expired", "--ahead", "--period", "--older-than",
                   "--include-dead", "--lock-wait", "--dry-run"):  # fmt: skip
        assert option in done.stdout
