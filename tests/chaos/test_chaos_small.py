# SPDX-License-Identifier: MIT
"""The chaos harness (``python -m chaos``, docs/chaos.md) at CI size: 2,000 messages.

Producers, relays and consumers run as processes on a private PostgreSQL cluster and
RabbitMQ while they are SIGKILLed, their backends terminated and the cluster restarted
with ``-m immediate``; the checker then finds no message lost, doubled or stuck. The
run bounds itself; missing services skip locally and fail in CI.

The verdict must not depend on the machine's load: on a busy machine every step is
slower, and a drain cut at a fixed clock reports the messages still on their way as
stuck. So ``--seconds`` only plans the run (the faults stop before it); the drain then
waits while the pipeline keeps making progress, and gives up when nothing progressed for
``--stall`` seconds, or at the generous absolute cap ``--max-seconds``
(:mod:`chaos.headway`).
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.pgcluster import SERVER_USER, find_bindir
from tests.conftest import unavailable
from tests.e2e._common import BROKER_URLS, reachable

REPO = Path(__file__).resolve().parents[2]
MESSAGES = 2000
DEADLINE = 85  # seconds: the planned run; past it only while the pipeline progresses
STALL = 30  # seconds without progress that end the drain (a restart, a redelivery fit)
CAP = 420  # seconds: the absolute cap; the run stops by itself, whatever happens

pytestmark = [pytest.mark.slow, pytest.mark.timeout(CAP + 120)]


def _require_services() -> None:
    if find_bindir() is None:
        unavailable("the PostgreSQL server binaries (initdb, pg_ctl)")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            unavailable(f"a {SERVER_USER!r} user to run the private PostgreSQL as")
        if shutil.which("runuser") is None:
            unavailable("runuser (to run the private PostgreSQL as a non-root user)")
    if not asyncio.run(reachable("rabbitmq", BROKER_URLS["rabbitmq"])):
        unavailable(f"RabbitMQ at {BROKER_URLS['rabbitmq']}")


def test_nothing_lost_doubled_or_stuck_under_faults(tmp_path: Path) -> None:
    """2,000 messages (30 % sent twice) under kills and database faults: lost, doubled, stuck 0."""
    _require_services()
    summary = tmp_path / "summary.json"
    args = [
        f"--messages={MESSAGES}",
        "--duplicates=0.3",
        "--kill-every=2",
        "--terminate-every=3",
        "--pg-restart-every=8",
        f"--seconds={DEADLINE}",
        f"--max-seconds={CAP}",
        f"--stall={STALL}",
        "--progress-every=0",
        f"--amqp={BROKER_URLS['rabbitmq']}",
        f"--workdir={tmp_path}",
        f"--summary-json={summary}",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "chaos", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=CAP + 60,
        check=False,
    )
    output = f"{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, output
    data = json.loads(summary.read_text(encoding="utf-8"))
    assert (data["lost"], data["doubled"], data["stuck"]) == (0, 0, 0), output
    assert (data["phantom"], data["unproduced"]) == (0, 0), output
    assert data["messages"] == MESSAGES
    assert data["effects"] == MESSAGES  # one row per message, exactly
    assert data["duplicated"] > MESSAGES * 0.2  # the same-id copies really went out
    # every kind of fault really struck
    assert data["faults"].get("sigkill", 0) >= 3, output
    assert data["faults"].get("pg_terminate_backend", 0) >= 1, output
    assert data["faults"].get("pg_restart", 0) >= 1, output
    assert data["quiescent"], output
