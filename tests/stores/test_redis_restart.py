# SPDX-License-Identifier: MIT
"""A Redis crash under the Redis store, on a redis-server of the test's own (docs/stores.md).

What a crash of Redis (SIGKILL, then start again) does to completed keys:

* no persistence (no AOF, no RDB snapshot): every completed key is forgotten, so a
  duplicate runs the function **again**: the durability documented for this setup;
* ``appendonly yes``: the completed keys come back and duplicates replay (with
  ``appendfsync always`` at once; with ``everysec`` once a second has passed).

While Redis is down every call raises ``StoreUnavailable``; after the restart the same
store object works again although Redis lost its script cache (``NOSCRIPT`` fallback).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import onceonly
from tests.outbox.test_relay_outage import Server, _free_port, _need


def _server(tmp_path: Path, *persistence: str) -> Server:
    port = _free_port()
    argv = [
        _need("redis-server"),
        "--bind", "127.0.0.1", "--port", str(port), "--dir", str(tmp_path),
        "--save", "", *persistence,
    ]  # fmt: skip
    return Server(argv, port)


def _crash(server: Server) -> None:
    """SIGKILL: no shutdown save, no final fsync (a machine or process crash)."""
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(10)
    server.proc = None


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for s in started:
        s.stop()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("persistence", "settle", "kept"),
    [
        ((), 0.0, False),
        (("--appendonly", "yes", "--appendfsync", "always"), 0.0, True),
        (("--appendonly", "yes", "--appendfsync", "everysec"), 1.5, True),
    ],
    ids=["no-aof", "aof-always", "aof-everysec"],
)
def test_a_redis_crash_keeps_completed_keys_only_with_aof(
    tmp_path: Path,
    servers: list[Server],
    persistence: tuple[str, ...],
    settle: float,
    kept: bool,
) -> None:
    """Without AOF a crash forgets completed keys (they run again); with AOF they replay."""
    server = _server(tmp_path, *persistence)
    servers.append(server)
    server.start()
    store = onceonly.open_store(f"redis://127.0.0.1:{server.port}/0", socket_timeout=1)
    runs: list[str] = []

    @onceonly.idempotent(store, key=lambda order: order, scope="charge", wait=0.1)
    def charge(order: str) -> str:
        runs.append(order)
        return f"charged {order}"

    try:
        assert charge("o-1") == charge("o-1") == "charged o-1"
        assert runs == ["o-1"]
        time.sleep(settle)  # everysec: the AOF is fsynced within about a second
        _crash(server)
        with pytest.raises(onceonly.StoreUnavailable):
            charge("o-1")
        server.start()
        deadline = time.monotonic() + 10
        while True:  # the AOF is loaded before Redis answers (LOADING: unavailable)
            try:
                assert charge("o-1") == "charged o-1"
                break
            except onceonly.StoreUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert runs == (["o-1"] if kept else ["o-1", "o-1"])
    finally:
        store.close()
