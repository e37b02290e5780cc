# SPDX-License-Identifier: MIT
"""``onceonly dashboard``: prints its URL, binds loopback by default, takes the token from
ONCEONLY_DASHBOARD_TOKEN, and serves the same app."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import onceonly
from onceonly._core.state import State
from tests.admin._records import put

SRC = Path(__file__).resolve().parents[2] / "src"


@contextmanager
def serve(url: str, *extra: str, token: str | None = None) -> Iterator[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("ONCEONLY_DASHBOARD_TOKEN", None)
    if token is not None:
        env["ONCEONLY_DASHBOARD_TOKEN"] = token
    with subprocess.Popen(
        [sys.executable, "-m", "onceonly", "dashboard", "--url", url, "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            assert line.startswith("http://"), (line, proc.stderr.read() if proc.stderr else "")
            yield line
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""


def _post(url: str, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, method="POST", headers=headers, data=b"")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_cli_serves_on_loopback_with_the_token_from_the_environment(tmp_path: Path) -> None:
    """The printed URL is 127.0.0.1; reads work; a write needs the env token."""
    url = f"sqlite:///{tmp_path / 'o.db'}"
    store = onceonly.open_store(url)
    store.migrate()
    put(store, "billing", "k1", State.DEAD, attempts=3, error="boom")
    store.close()
    with serve(url, token="t0ken") as base:
        assert base.startswith("http://127.0.0.1:") and base.endswith("/")
        with urllib.request.urlopen(base + "api/summary", timeout=10) as response:
            assert json.load(response)["by_state"]["dead"] == 1
        target = base + "api/records/billing/k1/redrive"
        assert _post(target, {}) == 401
        assert _post(target, {"Authorization": "Bearer wrong"}) == 403
        assert _post(target, {"Authorization": "Bearer t0ken"}) == 200
    store = onceonly.open_store(url)
    record = onceonly.Admin(store).show("billing", "k1")
    store.close()
    assert record is not None and record.state is State.FAILED


def test_cli_without_a_token_is_read_only(tmp_path: Path) -> None:
    """No ONCEONLY_DASHBOARD_TOKEN: even a bearer token is refused."""
    url = f"sqlite:///{tmp_path / 'o.db'}"
    store = onceonly.open_store(url)
    store.migrate()
    put(store, "billing", "k1", State.DEAD, attempts=3)
    store.close()
    with serve(url) as base:
        assert _post(base + "api/records/billing/k1/redrive", {"Authorization": "Bearer x"}) == 403


def test_cli_refuses_a_missing_sqlite_file(tmp_path: Path) -> None:
    """A mistyped SQLite path is a usage error (exit 2), not a new empty database."""
    proc = subprocess.run(
        [sys.executable, "-m", "onceonly", "dashboard", "--url", f"sqlite:///{tmp_path}/no.db"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        timeout=30,
        check=False,
    )
    assert proc.returncode == 2 and "no.db" in proc.stderr
