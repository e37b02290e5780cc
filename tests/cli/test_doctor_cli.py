# SPDX-License-Identifier: MIT
"""`onceonly doctor` against real services: exit 1 with a fix for each problem."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import onceonly
from tests.cli.test_records_cli import onceonly_cli
from tests.conftest import StoreFactory, unavailable

NATS_URL = os.environ.get("ONCEONLY_TEST_NATS", "nats://127.0.0.1:4222")
REDIS_URL = os.environ.get("ONCEONLY_TEST_REDIS", "redis://127.0.0.1:6379/0")


def test_sqlite_not_migrated_then_migrated(tmp_path: Path) -> None:
    """A table never migrated is a problem with its fix; after migrate() all is well."""
    (tmp_path / "d.db").touch()  # an existing database without tables (none: exit 2)
    url = f"sqlite:///{tmp_path / 'd.db'}"
    done = onceonly_cli("doctor", "--url", url)
    assert done.returncode == 1
    assert "FAIL  schema" in done.stdout and "store.migrate()" in done.stdout
    store = onceonly.open_store(url)
    store.migrate()
    store.close()
    done = onceonly_cli("doctor", "--url", url)
    assert (done.returncode, done.stdout.splitlines()[-1]) == (0, "0 problem(s)")


def test_postgres_schema_clock_and_pooling(pg_store_factory: StoreFactory) -> None:
    """On a direct PostgreSQL connection: schema, clock and pooling checks pass once migrated."""
    url, table = pg_store_factory.url, pg_store_factory.table
    assert onceonly_cli("doctor", "--url", url, "--table", table).returncode == 1
    pg_store_factory().migrate()
    done = onceonly_cli("doctor", "--url", url, "--table", table)
    assert done.returncode == 0, done.stdout
    for check in ("schema", "clock", "pooling"):
        assert f"ok    {check}" in done.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def evicting_redis() -> Iterator[str]:
    """A private redis-server that evicts keys (never the shared one)."""
    port = _free_port()
    try:
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--maxmemory-policy", "allkeys-lru"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    except FileNotFoundError:
        unavailable("redis-server")
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


def test_redis_eviction_policy(tmp_path: Path, evicting_redis: str) -> None:
    """An evicting Redis is a problem; the shared noeviction one is fine."""
    url = f"sqlite:///{tmp_path / 'd.db'}"
    store = onceonly.open_store(url)
    store.migrate()
    store.close()
    done = onceonly_cli("doctor", "--url", url, "--broker", evicting_redis)
    assert done.returncode == 1
    assert "allkeys-lru" in done.stdout and "noeviction" in done.stdout
    try:
        import redis

        redis.Redis.from_url(REDIS_URL, socket_timeout=2).ping()
    except Exception:
        unavailable(f"Redis at {REDIS_URL}")
    assert onceonly_cli("doctor", "--url", url, "--broker", REDIS_URL).returncode == 0


@pytest.fixture
def nats_stream() -> Iterator[tuple[str, str]]:
    """A private JetStream stream (1 day max_age) and consumer (5 x 30 s)."""
    import nats
    from nats.js.api import ConsumerConfig, StreamConfig

    name = f"doctor_{uuid.uuid4().hex[:10]}"

    async def setup() -> None:
        nc = await nats.connect(NATS_URL, connect_timeout=3, max_reconnect_attempts=0)
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=name, subjects=[f"{name}.>"], max_age=86400))
        await js.add_consumer(
            name, ConsumerConfig(durable_name="worker", max_deliver=5, ack_wait=30)
        )
        await nc.close()

    async def teardown() -> None:
        nc = await nats.connect(NATS_URL, connect_timeout=3, max_reconnect_attempts=0)
        await nc.jetstream().delete_stream(name)
        await nc.close()

    try:
        asyncio.run(setup())
    except Exception:
        unavailable(f"NATS JetStream at {NATS_URL}")
    try:
        yield name, "worker"
    finally:
        asyncio.run(teardown())


def test_nats_redelivery_horizon(tmp_path: Path, nats_stream: tuple[str, str]) -> None:
    """A ttl shorter than max_deliver x ack_wait or max_age is a problem; a longer one is not."""
    url = f"sqlite:///{tmp_path / 'd.db'}"
    store = onceonly.open_store(url)
    store.migrate()
    store.close()
    stream, consumer = nats_stream
    base = ["doctor", "--url", url, "--broker", NATS_URL, "--stream", stream]
    short = onceonly_cli(*base, "--consumer", consumer, "--ttl", "60s")
    assert short.returncode == 1
    assert "max_deliver * ack_wait (150 s)" in short.stdout and "max_age" in short.stdout
    middle = onceonly_cli(*base, "--consumer", consumer, "--ttl", "1h")
    assert middle.returncode == 1 and "1 problem(s)" in middle.stdout  # max_age only
    assert onceonly_cli(*base, "--consumer", consumer, "--ttl", "2d").returncode == 0


def test_unreachable_broker_is_a_finding(tmp_path: Path) -> None:
    """A broker that cannot be reached is reported with what to check, not a traceback."""
    url = f"sqlite:///{tmp_path / 'd.db'}"
    store = onceonly.open_store(url)
    store.migrate()
    store.close()
    dead = f"redis://127.0.0.1:{_free_port()}/0"
    done = onceonly_cli("doctor", "--url", url, "--broker", dead, "--broker", "mqtt://x")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "could not check redis://" in done.stdout and "no checks for mqtt://" in done.stdout


def test_pool_smaller_than_the_consumers_concurrency(pg_store_factory: StoreFactory) -> None:
    """--concurrency above the pool's max_size (this store's 10, or --pool-size) fails."""
    store = pg_store_factory()
    store.migrate()
    url, table = pg_store_factory.url, pg_store_factory.table
    common = ("doctor", "--url", url, "--table", table)
    done = onceonly_cli(*common, "--concurrency", "16")
    assert done.returncode == 1, done.stdout
    assert "FAIL  pool: consumers run 16 handlers at once" in done.stdout
    assert "max_size to at least 16" in done.stdout
    done = onceonly_cli(*common, "--concurrency", "16", "--pool-size", "32")
    assert done.returncode == 0, done.stdout
    assert "ok    pool: pool of 32 for 16 concurrent handlers" in done.stdout
    assert onceonly_cli(*common, "--concurrency", "0").returncode == 2


def _management(method: str, path: str, body: Any = None) -> None:
    import base64
    import urllib.request

    request = urllib.request.Request(
        f"http://127.0.0.1:15672{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={
            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
            "Content-Type": "application/json",
        },
    )
    urllib.request.urlopen(request, timeout=5).close()


@pytest.fixture
def rabbit_queues() -> Iterator[tuple[str, str, str]]:
    """Three queues: an x-message-ttl of 1 h, a policy message-ttl of 2 h, no TTL."""
    tag = uuid.uuid4().hex[:10]
    names = (f"doctor-{tag}-arg", f"doctor-{tag}-policy", f"doctor-{tag}-none")
    try:
        _management("PUT", f"/api/queues/%2F/{names[0]}",
                    {"durable": False, "arguments": {"x-message-ttl": 3_600_000}})  # fmt: skip
        _management("PUT", f"/api/queues/%2F/{names[1]}", {"durable": False})
        _management("PUT", f"/api/queues/%2F/{names[2]}", {"durable": False})
        _management("PUT", f"/api/policies/%2F/doctor-{tag}",
                    {"pattern": f"^{names[1]}$", "definition": {"message-ttl": 7_200_000},
                     "apply-to": "queues"})  # fmt: skip
    except OSError:
        unavailable("the RabbitMQ management API at 127.0.0.1:15672")
    try:
        yield names
    finally:
        for name in names:
            _management("DELETE", f"/api/queues/%2F/{name}")
        _management("DELETE", f"/api/policies/%2F/doctor-{tag}")


def test_rabbitmq_message_ttl_against_the_inbox_ttl(
    tmp_path: Path, rabbit_queues: tuple[str, str, str]
) -> None:
    """A queue argument or policy keeping messages longer than the ttl is a problem."""
    url = f"sqlite:///{tmp_path / 'd.db'}"
    store = onceonly.open_store(url)
    store.migrate()
    store.close()
    arg, policy, none = rabbit_queues
    base = ["doctor", "--url", url, "--broker", "amqp://guest:guest@127.0.0.1:5672/"]
    done = onceonly_cli(*base, "--queue", arg, "--ttl", "60s")
    assert done.returncode == 1 and f"queue {arg} x-message-ttl: 3600 s" in done.stdout
    done = onceonly_cli(*base, "--queue", policy, "--ttl", "1h")
    assert done.returncode == 1 and "policy message-ttl: 7200 s" in done.stdout
    done = onceonly_cli(*base, "--queue", policy, "--ttl", "2h")
    assert done.returncode == 0, done.stdout
    done = onceonly_cli(*base, "--queue", none, "--ttl", "60s")
    assert done.returncode == 0 and "no message TTL" in done.stdout
    done = onceonly_cli(*base, "--ttl", "60s")
    assert done.returncode == 1 and "without --queue" in done.stdout
