# SPDX-License-Identifier: MIT
"""``onceonly demo``: a real run with crashing workers, the counting, bad URLs."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from onceonly.cli import main
from onceonly.demo._report import SideResult, count_charges, render_table, verdict


def run_cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onceonly.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def table_row(stdout: str, label: str) -> list[str]:
    """The cells of one row of the demo's table."""
    for line in stdout.splitlines():
        if line.startswith(label + " "):
            return re.split(r"\s{2,}", line[len(label) :].strip())
    raise AssertionError(f"no {label!r} row in:\n{stdout}")


def assert_onceonly_exact(stdout: str) -> None:
    assert table_row(stdout, "double charges")[1] == "0"
    assert table_row(stdout, "lost charges")[1] == "0"
    expected = table_row(stdout, "charges expected")[1]
    assert table_row(stdout, "charges observed")[1] == expected
    assert "onceonly: every message charged exactly once" in stdout


def test_demo_on_sqlite_with_crashes_charges_once() -> None:
    """200 messages, 3 SIGKILLed workers: onceonly charges each message exactly once."""
    proc = run_cli("--messages", "200", "--workers", "3", "--crashes", "20", "--no-progress")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert table_row(out, "messages") == ["200", "200"]
    assert int(table_row(out, "crashes (SIGKILL)")[1]) > 0
    deliveries = int(table_row(out, "deliveries")[1].replace(",", ""))
    assert deliveries > 200  # producer retries and crashes redeliver
    assert_onceonly_exact(out)
    assert "\r" not in proc.stderr  # no progress bar when not a terminal


def test_demo_on_postgres() -> None:
    """The same run on PostgreSQL with ``--url``."""
    from tests.conftest import require_postgres

    url = require_postgres()
    proc = run_cli(
        "--messages", "200", "--workers", "3", "--crashes", "20", "--no-progress", "--url", url
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PostgreSQL" in proc.stdout
    assert_onceonly_exact(proc.stdout)


def test_demo_on_mariadb() -> None:
    """The same run on MariaDB/MySQL with ``--url mysql://…``."""
    from tests.conftest import require_mysql

    url = require_mysql()
    proc = run_cli(
        "--messages", "200", "--workers", "3", "--crashes", "20", "--no-progress", "--url", url
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MariaDB/MySQL" in proc.stdout
    assert_onceonly_exact(proc.stdout)


def test_unreachable_mariadb_is_a_clear_error() -> None:
    proc = run_cli("--url", "mysql://nobody@127.0.0.1:1/none", "--no-progress", timeout=30)
    assert proc.returncode == 2
    assert "onceonly demo: error: cannot connect to MariaDB/MySQL" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_count_charges_finds_doubles_and_losses() -> None:
    """A double, a triple and a lost charge are counted as 3 double and 1 lost."""
    charges = [
        ("m1", 100),
        ("m2", 250),
        ("m2", 250),
        ("m4", 70),
        ("m4", 70),
        ("m4", 70),
        ("m5", 10),
    ]
    count = count_charges(["m1", "m2", "m3", "m4", "m5"], charges)
    assert count.expected == 5
    assert count.observed == 7
    assert count.double == 3
    assert count.lost == 1
    assert count.unknown == 0
    assert count.overcharged == 250 + 70 + 70
    assert not count.exact

    result = SideResult("naive", 5, deliveries=9, crashes=2, charges=count, seconds=0.5)
    ok, line = verdict(result)
    assert not ok
    assert line == "naive: FAILED, 3 double charges, 1 lost charge"
    table = render_table([result])
    assert table_row(table, "double charges") == ["3"]
    assert table_row(table, "lost charges") == ["1"]
    assert table_row(table, "duplicates delivered") == ["4"]
    assert table_row(table, "amount overcharged") == ["3.90"]
    assert table_row(table, "messages/s") == ["10"]


def test_count_charges_exact_and_unknown() -> None:
    """Exactly one charge per message passes; a charge of an unknown id does not."""
    exact = count_charges(["a", "b"], [("b", 1), ("a", 2)])
    assert (exact.observed, exact.double, exact.lost, exact.exact) == (2, 0, 0, True)
    result = SideResult("onceonly", 2, deliveries=2, crashes=0, charges=exact, seconds=1.0)
    assert verdict(result) == (True, "onceonly: every message charged exactly once")

    stray = count_charges(["a"], [("a", 1), ("zz", 5)])
    assert (stray.unknown, stray.exact) == (1, False)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mssql://sa@localhost/db", "unsupported database URL scheme 'mssql'"),
        ("mysql://root@localhost", "the MariaDB/MySQL URL names no database"),
        ("onceonly.db", "unsupported database URL scheme '(none)'"),
        ("sqlite://host/x.db", "SQLite URLs have no host"),
        ("sqlite://", "SQLite file"),
    ],
)
def test_bad_url_is_a_clear_usage_error(
    url: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad ``--url`` exits 2 with a message naming the problem, before any work."""
    assert main(["demo", "--url", url]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert "sqlite:///" in captured.err  # says what would work
    assert captured.out == ""


def test_unreachable_postgres_is_a_clear_error() -> None:
    """A PostgreSQL URL nobody listens on exits 2 with one line, not a traceback."""
    proc = run_cli("--url", "postgresql://nobody@127.0.0.1:1/none", "--no-progress", timeout=30)
    assert proc.returncode == 2
    assert "onceonly demo: error: cannot connect to PostgreSQL" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_lists_demo(capsys: pytest.CaptureFixture[str]) -> None:
    """``onceonly --help`` names the demo sub-command and returns 0."""
    assert main(["--help"]) == 0
    assert "demo" in capsys.readouterr().out
