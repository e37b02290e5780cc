# SPDX-License-Identifier: MIT
"""Configuration errors are not outages: a mistyped SQLite path, a database that does
not exist or a login the server refuses exits 2 ("fix the configuration") with a line
that names what is wrong, and creates nothing; only a store that cannot be reached right
now exits 3 ("retry"). Runs the real console script against real servers."""

from __future__ import annotations

import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from tests.conftest import MYSQL_URL, PG_URL, require_mysql, require_postgres

SCRIPT = str(Path(sys.executable).with_name("onceonly"))

# every command that reads or operates on existing records, with its arguments after --url
READERS = [
    ["records", "list"],
    ["records", "show", "s", "k"],
    ["records", "purge"],
    ["records", "purge", "--dry-run"],
    ["records", "reap"],
    ["records", "redrive", "--all"],
    ["records", "redrive", "--all", "--dry-run"],
    ["records", "delete", "s", "k"],
    ["records", "partitions"],
    ["stats"],
    ["doctor"],
    ["outbox", "counts"],
]


def onceonly(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=60, check=False)


def run(command: list[str], url: str) -> subprocess.CompletedProcess[str]:
    """``command`` with ``--url url`` placed right after the sub-command's action."""
    head = 2 if command[0] in ("records", "outbox") else 1
    return onceonly(*command[:head], "--url", url, *command[head:])


def _with(url: str, *, user: str | None = None, database: str | None = None) -> str:
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if user is not None:
        netloc = f"{user}@{netloc.rsplit('@', 1)[-1]}"
    path = parts.path if database is None else f"/{database}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, path, parts.query, ""))


@pytest.mark.parametrize("command", READERS, ids=lambda c: " ".join(c))
def test_a_missing_sqlite_file_exits_2_names_the_path_and_creates_nothing(
    command: list[str], tmp_path: Path
) -> None:
    """Every command over existing records refuses a SQLite path that does not exist."""
    db = tmp_path / "typo.db"
    proc = run(command, f"sqlite:///{db}")
    assert proc.returncode == 2, proc
    assert not db.exists(), "an empty database was created at the mistyped path"
    first = proc.stderr.splitlines()[0]
    assert "no SQLite database at" in first and str(db) in first, proc.stderr
    assert "migrate()" not in proc.stderr  # not the misleading "run store.migrate() first"
    assert "Traceback" not in proc.stderr


def test_migrate_still_creates_a_new_sqlite_file(tmp_path: Path) -> None:
    """``onceonly migrate`` creates the file; the commands then work on it."""
    db = tmp_path / "new.db"
    assert onceonly("migrate", "--url", f"sqlite:///{db}").returncode == 0
    assert db.exists()
    proc = onceonly("records", "list", "--url", f"sqlite:///{db}")
    assert proc.returncode == 0, proc


def test_a_sqlite_file_without_tables_still_says_migrate(tmp_path: Path) -> None:
    """An existing file without tables is NotMigrated (exit 2), as before."""
    db = tmp_path / "empty.db"
    db.touch()
    proc = onceonly("stats", "--url", f"sqlite:///{db}")
    assert proc.returncode == 2 and "migrate" in proc.stderr, proc


@pytest.mark.parametrize("command", [["stats"], ["records", "list"], ["doctor"]])
def test_postgres_missing_database_exits_2(command: list[str]) -> None:
    """A database that does not exist (3D000) is a configuration error, not an outage."""
    require_postgres()
    proc = run(command, _with(PG_URL, database="onceonly_no_such_db"))
    assert proc.returncode == 2, proc
    assert "onceonly_no_such_db" in proc.stderr and "does not exist" in proc.stderr
    assert "Retry" not in proc.stderr, proc.stderr


def test_postgres_refused_login_exits_2() -> None:
    """A role the server does not know (28000) is a configuration error."""
    require_postgres()
    proc = run(["stats"], _with(PG_URL, user="onceonly_no_such_role"))
    assert proc.returncode == 2, proc
    assert "onceonly_no_such_role" in proc.stderr


def test_postgres_connection_refused_still_exits_3() -> None:
    """Nothing listening: transient, exit 3."""
    proc = run(["stats"], "postgresql://postgres@127.0.0.1:1/test?connect_timeout=2")
    assert proc.returncode == 3, proc


@pytest.mark.parametrize("command", [["stats"], ["records", "list"]])
def test_mysql_missing_database_exits_2(command: list[str]) -> None:
    """MariaDB's 1049 (unknown database) is a configuration error."""
    require_mysql()
    proc = run(command, _with(MYSQL_URL, database="onceonly_no_such_db"))
    assert proc.returncode == 2, proc
    assert "onceonly_no_such_db" in proc.stderr


def test_mysql_refused_login_exits_2() -> None:
    """MariaDB's 1045 (access denied) is a configuration error."""
    require_mysql()
    proc = run(["stats"], _with(MYSQL_URL, user="onceonly_nobody:wrong"))
    assert proc.returncode == 2, proc
    assert "Access denied" in proc.stderr


def test_mysql_connection_refused_still_exits_3() -> None:
    """Nothing listening: transient, exit 3."""
    proc = run(["stats"], "mysql://root@127.0.0.1:1/test")
    assert proc.returncode == 3, proc
