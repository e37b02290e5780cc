# SPDX-License-Identifier: MIT
"""The command line as an operator meets it: help on every option, one-line errors with
a hint, tracebacks only with -v, documented exit statuses, no secrets printed, no empty
database created by a typo. Runs the real console script."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from onceonly.cli import EXIT_STATUSES, build_parser

BIN = Path(sys.executable).parent
SECRET = "s3cret-never-printed"


def onceonly(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    exe = BIN / "onceonly"
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "onceonly"]
    return subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def _walk(parser: argparse.ArgumentParser, path: str = "onceonly"):  # type: ignore[no-untyped-def]
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _walk(child, f"{path} {name}")


def test_every_option_has_help() -> None:
    """Each option of each (sub-)command says what it does."""
    missing = [
        f"{path}: {'/'.join(action.option_strings)}"
        for path, parser in _walk(build_parser())
        for action in parser._actions
        if action.option_strings and not action.help
    ]
    assert missing == []


def test_python_m_onceonly_works() -> None:
    """``python -m onceonly`` is the same command."""
    proc = subprocess.run(
        [sys.executable, "-m", "onceonly", "--help"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and "exit statuses:" in proc.stdout


def test_exit_statuses_are_documented_in_help() -> None:
    """--help lists every exit status the command uses."""
    out = onceonly("--help").stdout
    for code in EXIT_STATUSES:
        assert f"  {code} " in out


def test_a_missing_sqlite_file_is_an_error_not_a_new_database(tmp_path: Path) -> None:
    """A typo in a SQLite path exits 2 with one line and creates nothing; --create does."""
    db = tmp_path / "typo.db"
    proc = onceonly("outbox", "--url", f"sqlite:///{db}", "counts")
    assert proc.returncode == 2, proc
    assert not db.exists()
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("onceonly outbox: error: no SQLite database at"), proc.stderr
    assert "--create" in lines[0] and "Traceback" not in proc.stderr
    proc = onceonly("outbox", "--url", f"sqlite:///{db}", "--create", "counts")
    assert db.exists()
    assert proc.returncode == 2 and "run store.migrate() first" in proc.stderr, proc


def test_typed_errors_are_one_line_with_a_hint_and_tracebacks_need_v(tmp_path: Path) -> None:
    """A typed error prints its line and a hint; -v adds the traceback."""
    db = tmp_path / "empty.db"
    db.touch()
    plain = onceonly("outbox", "--url", f"sqlite:///{db}", "counts")
    assert plain.returncode == 2
    assert plain.stderr.splitlines()[0].startswith("onceonly outbox: error: ")
    assert plain.stderr.splitlines()[1].startswith("hint (NotMigrated): ")
    assert "Traceback" not in plain.stderr
    loud = onceonly("outbox", "-v", "--url", f"sqlite:///{db}", "counts")
    assert loud.returncode == 2 and "Traceback" in loud.stderr


def test_unavailable_store_exits_3_and_never_prints_the_password() -> None:
    """A store that cannot be reached: exit 3, the cause, the password masked."""
    url = f"postgresql://postgres:{SECRET}@127.0.0.1:1/test?connect_timeout=2"
    proc = onceonly("outbox", "--url", url, "counts")
    assert proc.returncode == 3, proc
    assert "Connection refused" in proc.stderr or "refused" in proc.stderr
    assert SECRET not in proc.stderr + proc.stdout


@pytest.mark.timeout(60)
def test_relay_banner_redacts_store_and_broker_passwords(tmp_path: Path) -> None:
    """The relay's start line shows both URLs with their passwords masked."""
    db = tmp_path / "x.db"
    proc = onceonly(
        "relay",
        "--url",
        f"sqlite:///{db}",
        "--create",
        "--broker",
        f"ftp://user:{SECRET}@host/",
    )
    # an unknown broker scheme: refused before anything runs, and nothing printed leaks
    assert proc.returncode == 2
    assert SECRET not in proc.stderr + proc.stdout


@pytest.mark.parametrize("flag", [["-v"], ["--log-level", "debug"], ["-vv"]])
def test_logging_flags_work_before_and_after_the_command(flag: list[str], tmp_path: Path) -> None:
    """-v/--log-level are accepted on both sides of the sub-command's name."""
    db = tmp_path / "x.db"
    for args in ([*flag, "outbox", "--url", f"sqlite:///{db}", "--create", "counts"],
                 ["outbox", *flag, "--url", f"sqlite:///{db}", "--create", "counts"]):  # fmt: skip
        proc = onceonly(*args)
        assert "unrecognized arguments" not in proc.stderr, proc.stderr
        assert proc.returncode == 2  # not migrated: the flags parsed, the command ran


def test_migrate_command_creates_the_tables(tmp_path: Path) -> None:
    """``onceonly migrate`` makes a store usable (what NotMigrated's hint points to)."""
    db = tmp_path / "new.db"
    assert onceonly("outbox", "--url", f"sqlite:///{db}", "--create", "counts").returncode == 2
    proc = onceonly("migrate", "--url", f"sqlite:///{db}")
    assert proc.returncode == 0 and proc.stdout.startswith("migrated: "), proc
    again = onceonly("migrate", "--url", f"sqlite:///{db}")
    assert again.returncode == 0  # safe to repeat
    counts = onceonly("outbox", "--url", f"sqlite:///{db}", "counts")
    assert counts.returncode == 0 and '"dead": 0' in counts.stdout, counts


@pytest.mark.parametrize(
    "broker",
    [
        f"amqp://guest:{SECRET}@127.0.0.1:5672/",  # RabbitMQ refuses the login
        "amqp://guest:guest@127.0.0.1:5672/onceonly_no_such_vhost",
        "nats://nonexistent.invalid:4222",
    ],
)
def test_relay_exits_at_start_when_the_broker_refuses_or_is_unknown(
    broker: str, tmp_path: Path
) -> None:
    """Wrong credentials, vhost or host: exit 3 with one error line, no password shown."""
    import socket

    from tests.conftest import unavailable

    try:
        socket.create_connection(("127.0.0.1", 5672), 2).close()
    except OSError:
        unavailable("RabbitMQ on 127.0.0.1:5672")
    proc = onceonly(
        "relay", "--url", f"sqlite:///{tmp_path / 'x.db'}", "--create", "--broker", broker
    )
    assert proc.returncode == 3, proc
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, proc.stderr
    assert "hint (BrokerUnavailable)" in proc.stderr
    assert SECRET not in proc.stderr + proc.stdout
