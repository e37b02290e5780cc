# SPDX-License-Identifier: MIT
"""`onceonly records` and `onceonly stats` run as the installed console script."""

from __future__ import annotations

import argparse
import json
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly._core.state import State
from onceonly.cli import build_parser
from tests.admin._records import keys, put
from tests.conftest import StoreFactory

SCRIPT = str(Path(sys.executable).with_name("onceonly"))


def onceonly_cli(*args: str, stderr: Any = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRIPT, *args], stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=60, check=False
    )


def _seed(store: Any) -> None:
    for i in range(5):
        put(store, "billing", f"old{i}", State.COMPLETED, ttl=-60)
    put(store, "billing", "live", State.COMPLETED, ttl=3600)
    put(store, "billing", "stuck", State.IN_PROGRESS, lease=-60)
    put(store, "mail", "poison", State.DEAD, attempts=5, error="boom", payload='{"to": "x"}')


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    store = onceonly.open_store(url)
    store.migrate()
    _seed(store)
    store.close()
    return url


def test_purge_dry_run_then_purge(url: str) -> None:
    """A dry run counts, a purge deletes in batches and prints a summary."""
    done = onceonly_cli("records", "purge", "--url", url, "--dry-run")
    assert (done.returncode, done.stdout) == (0, "would purge 5 records\n")
    done = onceonly_cli("records", "purge", "--url", url, "--batch-size", "2", "--pause", "0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("purged 5 records in 3 batches")
    assert done.stderr == ""  # no bar when stderr is not a terminal
    store = onceonly.open_store(url)
    assert keys(store) == {("billing", "live"), ("billing", "stuck"), ("mail", "poison")}
    store.close()


def test_purge_draws_a_progress_bar_on_a_terminal(url: str) -> None:
    """On a terminal, stderr shows a bar reaching the total."""
    leader, follower = pty.openpty()
    try:
        done = onceonly_cli("records", "purge", "--url", url, "--pause", "0", stderr=follower)
        os.close(follower)
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(leader)
    assert done.returncode == 0
    assert b"5/5 records purged" in drawn and b"#" in drawn


def test_reap_list_show_redrive_delete_and_stats(url: str) -> None:
    """The operator's round: reap the stuck claim, inspect, redrive the dead one, delete."""
    done = onceonly_cli("records", "reap", "--url", url, "--pause", "0")
    assert done.returncode == 0 and done.stdout.startswith("reaped 1 records; 0 skipped")
    listed = onceonly_cli("records", "list", "--url", url, "--state", "failed", "--json")
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [(r["key"], r["attempts"]) for r in rows] == [("stuck", 1)]
    shown = onceonly_cli("records", "show", "--url", url, "mail", "poison", "--json")
    record = json.loads(shown.stdout)
    assert record["state"] == "dead" and record["payload"] == '{"to": "x"}'
    assert record["error"] == "boom"
    text = onceonly_cli("records", "show", "--url", url, "mail", "poison").stdout
    assert "state" in text and "dead" in text
    assert onceonly_cli("records", "show", "--url", url, "mail", "nope").returncode == 1
    redriven = onceonly_cli("records", "redrive", "--url", url, "--all")
    assert (redriven.returncode, redriven.stdout) == (0, "redriven: 1\n")
    again = onceonly_cli("records", "redrive", "--url", url, "billing", "live")
    assert again.returncode == 1 and "not redriven" in again.stderr  # completed: never
    stats = json.loads(onceonly_cli("stats", "--url", url, "--json").stdout)
    assert stats["scopes"]["billing"]["expired"] == 5
    assert stats["scopes"]["mail"]["failed"] == 1 and stats["sizes"]["file"] > 0
    assert stats["outbox"] == {"pending": 0, "dead": 0}
    assert onceonly_cli("records", "delete", "--url", url, "mail", "poison").returncode == 0
    assert onceonly_cli("records", "delete", "--url", url, "mail", "poison").returncode == 1
    table = onceonly_cli("stats", "--url", url).stdout
    assert table.splitlines()[0].split("\t")[:2] == ["scope", "in_progress"]


@pytest.mark.parametrize(
    "argv",
    [
        ["records", "purge", "--older-than", "3x"],
        ["records", "purge", "--batch-size", "0"],
        ["records", "reap", "--pause", "-1"],
        ["records", "redrive"],
        ["records", "redrive", "only-scope"],
    ],
)
def test_bad_input_is_a_usage_error(url: str, argv: list[str]) -> None:
    """Bad options exit 2 with a one-line reason, never a traceback."""
    done = onceonly_cli(*argv[:2], "--url", url, *argv[2:])
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "error" in done.stderr


def test_every_option_has_help() -> None:
    """Every option of records, stats and doctor has help text."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    parsers = [sub.choices["stats"], sub.choices["doctor"]]
    records = sub.choices["records"]
    inner = next(a for a in records._actions if isinstance(a, argparse._SubParsersAction))
    parsers += list(inner.choices.values())
    for p in parsers:
        for action in p._actions:
            assert action.help, (p.prog, action.dest)


def test_records_on_postgres(pg_store_factory: StoreFactory) -> None:
    """The same commands on PostgreSQL, with the table and index sizes in stats."""
    store = pg_store_factory()
    store.migrate()
    _seed(store)
    url, table = pg_store_factory.url, pg_store_factory.table
    done = onceonly_cli("records", "purge", "--url", url, "--table", table, "--pause", "0")
    assert done.stdout.startswith("purged 5 records"), done.stderr
    stats = json.loads(onceonly_cli("stats", "--url", url, "--table", table, "--json").stdout)
    assert stats["sizes"]["table"] > 0 and "indexes" in stats["sizes"]
    assert stats["scopes"]["billing"]["in_progress"] == 1


def test_outbox_options_before_or_after_the_action(tmp_path: Path) -> None:
    """`outbox counts --url U` (the records shape) and `outbox --url U counts` both work."""
    url = f"sqlite:///{tmp_path / 'o.db'}"
    store = onceonly.open_store(url)
    store.migrate()
    store.close()
    for argv in (["outbox", "counts", "--url", url], ["outbox", "--url", url, "counts"]):
        done = onceonly_cli(*argv)
        assert (done.returncode, json.loads(done.stdout)) == (0, {"pending": 0, "dead": 0})
    missing = onceonly_cli("outbox", "counts")
    assert missing.returncode == 2 and "--url" in missing.stderr
