# SPDX-License-Identifier: MIT
"""The Redis store on a Redis Cluster and behind Sentinel, on servers of the test's own."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly._core.state import Policy
from onceonly.inbox import LeasedRunner
from onceonly.stores.redis._url import RedisTarget, parse
from tests.outbox.test_relay_outage import Server, _free_port, _need


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("redis://h:1/2", RedisTarget("server", "redis://h:1/2")),
        ("rediss+cluster://h:7000", RedisTarget("cluster", "rediss://h:7000")),
        (
            "redis+sentinel://:pw@a:26379,b:26380/main/3",
            RedisTarget(
                "sentinel",
                sentinels=(("a", 26379), ("b", 26380)),
                service="main",
                db=3,
                password="pw",
            ),
        ),
        (
            "rediss+sentinel://s/main",
            RedisTarget("sentinel", sentinels=(("s", 26379),), service="main", ssl=True),
        ),
    ],
)
def test_urls_name_their_target(url: str, target: RedisTarget) -> None:
    """Server, Cluster and Sentinel URLs are read into what they name."""
    assert parse(url) == target


@pytest.mark.parametrize(
    "url", ["redis+sentinel://a:26379", "redis+sentinel:///main", "redis+sentinel://a:x/main"]
)
def test_bad_sentinel_urls_are_configuration_errors(url: str) -> None:
    """A Sentinel URL without sentinels, service or a numeric port is refused."""
    with pytest.raises(onceonly.ConfigurationError):
        onceonly.open_store(url)


def _redis(tmp_path: Path, name: str, *extra: str) -> Server:
    port = _free_port()
    home = tmp_path / name
    home.mkdir()
    argv = [_need("redis-server"), "--bind", "127.0.0.1", "--port", str(port),
            "--dir", str(home), "--save", "", *extra]  # fmt: skip
    return Server(argv, port)


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for s in reversed(started):
        s.stop()


def _until(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.fixture
def cluster(tmp_path: Path, servers: list[Server]) -> str:
    """Three cluster masters of our own, slots spread over them."""
    import redis

    # the bus port is given: by default it is port + 10000, past 65535 for a high port
    nodes = [
        _redis(tmp_path, f"n{i}", "--cluster-enabled", "yes", "--cluster-port", str(_free_port()))
        for i in range(3)
    ]
    for node in nodes:
        servers.append(node)
        node.start()
    subprocess.run(
        [_need("redis-cli"), "--cluster", "create",
         *(f"127.0.0.1:{n.port}" for n in nodes), "--cluster-replicas", "0", "--cluster-yes"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    clients = [redis.Redis(port=n.port) for n in nodes]
    _until(lambda: all(c.cluster("info")["cluster_state"] == "ok" for c in clients))
    for c in clients:
        c.close()
    return f"redis+cluster://127.0.0.1:{nodes[0].port}"


@pytest.mark.timeout(90)
def test_the_store_runs_on_a_cluster(cluster: str) -> None:
    """On three masters: each key runs once and replays, records spread over the nodes,
    and a stale holder is still fenced (every script touches one key: its node's)."""
    store = onceonly.open_store(cluster, prefix="c:")
    try:
        store.migrate()
        runs: list[int] = []

        @onceonly.idempotent(store, key=lambda n: f"order-{n}", scope="charge")
        def charge(n: int) -> int:
            runs.append(n)
            return n

        assert [charge(n) for n in range(30)] == list(range(30))
        assert [charge(n) for n in range(30)] == list(range(30))
        assert runs == list(range(30))
        per_node = [node.redis_connection.dbsize() for node in store.client.get_primaries()]
        assert sum(per_node) == 30 and sum(1 for n in per_node if n) >= 2, per_node

        runner = LeasedRunner(store, scope="fn", policy=Policy(0.3, 5), ttl=None, wait=0.05)
        stale = runner.claim("k", None)
        assert isinstance(stale, onceonly.Claim)
        time.sleep(0.4)
        assert runner.run("k", None, lambda: "winner") == ("winner", False, 2)
        with pytest.raises(onceonly.LeaseLost):
            stale.checkpoint("late", 1)
    finally:
        store.close()


@pytest.mark.timeout(90)
def test_the_store_finds_its_master_through_sentinel(tmp_path: Path, servers: list[Server]) -> None:
    """redis+sentinel://…/service asks the sentinel for the master and runs there."""
    master = _redis(tmp_path, "master")
    servers.append(master)
    master.start()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"sentinel monitor main 127.0.0.1 {master.port} 1\n"
        "sentinel down-after-milliseconds main 5000\n"
    )
    port = _free_port()
    sentinel = Server(
        [_need("redis-server"), str(conf), "--sentinel", "--port", str(port),
         "--bind", "127.0.0.1", "--dir", str(tmp_path)],
        port,
    )  # fmt: skip
    servers.append(sentinel)
    sentinel.start()
    store = onceonly.open_store(f"redis+sentinel://127.0.0.1:{port}/main/0", prefix="s:")
    try:
        runs: list[str] = []

        @onceonly.idempotent(store, key=lambda k: k, scope="charge")
        def charge(k: str) -> str:
            runs.append(k)
            return k

        assert charge("o-1") == charge("o-1") == "o-1" and runs == ["o-1"]
        import redis

        with redis.Redis(port=master.port) as direct:
            assert direct.exists("s:{6:charge:o-1}")
    finally:
        store.close()


@pytest.mark.timeout(90)
async def test_the_async_store_runs_on_a_cluster(cluster: str) -> None:
    """The async store on the same cluster: one run per key, then replays."""
    store = onceonly.open_async_store(cluster, prefix="ac:")
    try:
        await store.migrate()
        runs: list[int] = []

        @onceonly.idempotent(store, key=lambda n: f"order-{n}", scope="charge")
        async def charge(n: int) -> int:
            runs.append(n)
            return n

        assert [await charge(n) for n in range(10)] == list(range(10))
        assert [await charge(n) for n in range(10)] == list(range(10))
        assert runs == list(range(10))
    finally:
        await store.close()
