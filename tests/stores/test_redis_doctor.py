# SPDX-License-Identifier: MIT
"""`onceonly doctor --url redis://…`: eviction policy, AOF and clock of a Redis store, on
a redis-server of the test's own (its configuration is changed; never the shared one)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_records_cli import onceonly_cli
from tests.outbox.test_relay_outage import Server, _free_port, _need


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[tuple[str, object]]:
    import redis

    port = _free_port()
    server = Server(
        [_need("redis-server"), "--bind", "127.0.0.1", "--port", str(port),
         "--dir", str(tmp_path), "--save", ""],
        port,
    )  # fmt: skip
    server.start()
    client = redis.Redis(port=port)
    try:
        yield f"redis://127.0.0.1:{port}/0", client
    finally:
        client.close()
        server.stop()


@pytest.mark.parametrize(
    ("policy", "appendonly", "problems", "words"),
    [
        ("noeviction", "yes", 0, ["ok    redis-eviction", "ok    redis-durability"]),
        ("volatile-lru", "yes", 0, ["their duplicates then run again"]),
        ("allkeys-lru", "yes", 1, ["FAIL  redis-eviction", "live claim"]),
        ("noeviction", "no", 1, ["FAIL  redis-durability", "appendonly yes"]),
        ("allkeys-random", "no", 2, ["FAIL  redis-eviction", "FAIL  redis-durability"]),
    ],
)
def test_doctor_checks_a_redis_store(
    private_redis: tuple[str, object], policy: str, appendonly: str, problems: int, words: list[str]
) -> None:
    """noeviction / volatile-* with AOF pass; allkeys-* or no AOF are problems with a fix."""
    url, client = private_redis
    client.config_set("maxmemory-policy", policy)  # type: ignore[attr-defined]
    client.config_set("appendonly", appendonly)  # type: ignore[attr-defined]
    done = onceonly_cli("doctor", "--url", url)
    assert done.returncode == (1 if problems else 0), done.stdout
    assert done.stdout.splitlines()[-1] == f"{problems} problem(s)"
    assert "ok    clock" in done.stdout
    for word in words:
        assert word in done.stdout, done.stdout
