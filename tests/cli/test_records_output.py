# SPDX-License-Identifier: MIT
"""What ``onceonly records list`` prints (a header, stable columns, whole errors) and
``onceonly records redrive --dry-run`` (what would run again, changing nothing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly._core.admin import Query
from onceonly._core.state import State
from onceonly.admin import Admin
from tests.admin._records import put

SCRIPT = str(Path(sys.executable).with_name("onceonly"))
COLUMNS = ["scope", "key", "state", "attempts", "updated_at", "error"]
LONG_ERROR = (
    "ValueError: the card processor answered 402 for order 8812 after 3 retries;"
    " the customer's bank declined\twith reason\ncode 51 (insufficient funds)"
)


def onceonly_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    store = onceonly.open_store(url, migrate=True)
    put(store, "billing", "done", State.COMPLETED, ttl=3600)
    put(store, "billing", "poison", State.DEAD, attempts=5, error=LONG_ERROR)
    put(store, "billing", "flaky", State.FAILED, attempts=2, error="TimeoutError: slow")
    put(store, "mail", "bounce", State.DEAD, attempts=3, error="SMTPError: 550")
    store.close()
    return url


def snapshot(url: str) -> list[tuple[Any, ...]]:
    """Every record's identity, state, attempts and token (what a redrive changes)."""
    store = onceonly.open_store(url)
    try:
        return sorted(
            (r.scope, r.key, r.state.value, r.attempts, r.token, r.error)
            for r in Admin(store).iter_records(Query(limit=1000))
        )
    finally:
        store.close()


def test_list_prints_a_header_and_stable_columns(url: str) -> None:
    """The first line names the columns; each row has them in that order."""
    done = onceonly_cli("records", "list", "--url", url)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split("\t") == COLUMNS
    rows = [line.split("\t") for line in lines[1:]]
    assert all(len(row) == len(COLUMNS) for row in rows), rows
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("billing", "done", "completed", "0"),
        ("billing", "flaky", "failed", "2"),
        ("billing", "poison", "dead", "5"),
        ("mail", "bounce", "dead", "3"),
    ]


def test_list_prints_errors_whole_with_tabs_and_newlines_escaped(url: str) -> None:
    """An error is never cut; a tab or newline in it cannot break the row."""
    done = onceonly_cli("records", "list", "--url", url, "--state", "dead", "--scope", "billing")
    (_header, row) = done.stdout.splitlines()
    error = row.split("\t")[5]
    assert error == LONG_ERROR.replace("\t", "\\t").replace("\n", "\\n")
    assert len(error) > 60


def test_list_no_header_for_scripts(url: str) -> None:
    """--no-header prints the rows only."""
    done = onceonly_cli("records", "list", "--url", url, "--no-header", "--state", "dead")
    assert [line.split("\t")[1] for line in done.stdout.splitlines()] == ["poison", "bounce"]


def test_list_json_keeps_the_whole_error(url: str) -> None:
    """--json: one object per line, no header, the error as stored."""
    done = onceonly_cli("records", "list", "--url", url, "--json", "--state", "dead")
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["key"] for r in rows] == ["poison", "bounce"]
    assert rows[0]["error"] == LONG_ERROR


def test_redrive_all_dry_run_lists_and_counts_and_changes_nothing(url: str) -> None:
    """--dry-run prints each record a redrive would touch and the count; nothing moves."""
    before = snapshot(url)
    done = onceonly_cli("records", "redrive", "--url", url, "--all", "--dry-run")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split("\t") == COLUMNS
    assert [line.split("\t")[:3] for line in lines[1:-1]] == [
        ["billing", "poison", "dead"],
        ["mail", "bounce", "dead"],
    ]
    assert lines[-1] == "would redrive: 2"
    assert snapshot(url) == before
    # the real redrive does what the dry run announced
    real = onceonly_cli("records", "redrive", "--url", url, "--all")
    assert real.stdout == "redriven: 2\n"
    assert snapshot(url) != before


def test_redrive_dry_run_by_scope_and_state(url: str) -> None:
    """--scope and --state select as the real redrive does."""
    before = snapshot(url)
    done = onceonly_cli(
        "records", "redrive", "--url", url, "--scope", "billing", "--state", "failed",
        "--dry-run", "--no-header",
    )  # fmt: skip
    assert done.stdout.splitlines() == [
        done.stdout.splitlines()[0],
        "would redrive: 1",
    ]
    assert done.stdout.splitlines()[0].split("\t")[:4] == ["billing", "flaky", "failed", "2"]
    assert snapshot(url) == before


def test_redrive_one_dry_run(url: str) -> None:
    """SCOPE KEY --dry-run: 0 when it would be redriven, 1 (and why) when not."""
    before = snapshot(url)
    done = onceonly_cli("records", "redrive", "--url", url, "mail", "bounce", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "would redrive: 1"
    no = onceonly_cli("records", "redrive", "--url", url, "billing", "done", "--dry-run")
    assert no.returncode == 1 and "would not be redriven" in no.stderr
    assert no.stdout.splitlines()[-1] == "would redrive: 0"
    assert snapshot(url) == before
