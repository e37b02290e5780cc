# SPDX-License-Identifier: MIT
"""`onceonly relay` and `onceonly outbox` from the command line, on real services."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly.cli import main
from onceonly.testing import ListPublisher
from tests.conftest import unavailable

REDIS_URL = os.environ.get("ONCEONLY_TEST_REDIS", "redis://127.0.0.1:6379/0")
ROOT = Path(__file__).resolve().parents[2]


def _store_with_rows(path: Path, n: int) -> tuple[Any, list[str]]:
    store = onceonly.open_store(f"sqlite:///{path}")
    store.migrate()
    outbox = onceonly.Outbox(store)
    ids = []
    for i in range(n):
        with store.transaction() as session:
            ids.append(outbox.publish(session.connection, "events", {"i": i}))
    return store, ids


def test_outbox_list_counts_and_redrive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Dead rows are listed as JSON lines, counted, and redriven by id or all at once."""
    path = tmp_path / "o.db"
    store, ids = _store_with_rows(path, 3)
    onceonly.Relay(store, ListPublisher(fail={"events": -1}), max_attempts=1).run_once()
    store.close()
    url = f"sqlite:///{path}"
    assert main(["outbox", "--url", url, "counts"]) == 0
    assert json.loads(capsys.readouterr().out) == {"pending": 0, "dead": 3}
    assert main(["outbox", "--url", url, "list"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in rows] == ids
    assert rows[0]["payload"] == {"i": 0} and "refused" in rows[0]["last_error"]
    assert main(["outbox", "--url", url, "redrive", "--id", ids[0]]) == 0
    assert main(["outbox", "--url", url, "redrive", "--id", "no-such-id"]) == 1
    assert main(["outbox", "--url", url, "redrive", "--all"]) == 0
    capsys.readouterr()
    assert main(["outbox", "--url", url, "counts"]) == 0
    assert json.loads(capsys.readouterr().out) == {"pending": 3, "dead": 0}


def test_relay_bad_broker_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown broker scheme is a usage error with a clear message."""
    code = main(
        ["relay", "--url", f"sqlite:///{tmp_path / 'x.db'}", "--create", "--broker", "ftp://x"]
    )
    assert code == 2
    assert "unknown broker URL scheme" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_relay_process_publishes_then_stops_on_sigterm(tmp_path: Path) -> None:
    """The relay process publishes every row to Redis Streams and exits 0 on SIGTERM."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except Exception:
        unavailable(f"Redis at {REDIS_URL}")
    prefix = f"t-{uuid.uuid4().hex[:8]}:"
    path = tmp_path / "r.db"
    store, ids = _store_with_rows(path, 5)
    store.close()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "onceonly.cli",
            "relay",
            "--url",
            f"sqlite:///{path}",
            "--broker",
            REDIS_URL,
            "--prefix",
            prefix,
            "--poll-interval",
            "0.1",
        ],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while client.xlen(f"{prefix}events") < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        entries = client.xrange(f"{prefix}events")
        assert sorted(e[1][b"id"].decode() for e in entries) == sorted(ids)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
        client.delete(f"{prefix}events")
    assert proc.returncode == 0, err
    assert "published 5" in err
    store = onceonly.open_store(f"sqlite:///{path}")
    assert onceonly.Outbox(store).counts()["pending"] == 0
    store.close()
