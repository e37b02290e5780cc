# SPDX-License-Identifier: MIT
"""A broker outage longer than the relay's whole backoff budget makes no row dead
(issue: "the relay tells the truth"). Each test runs its OWN broker on a free port
(nats-server, redis-server), stops it, and starts it again; the shared brokers are never
touched. Also: the relay refuses to start against a broker it cannot log in to, and a
message the broker refuses (too large, wrong key type) still goes dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import onceonly
from tests.conftest import IN_CI

pytestmark = pytest.mark.timeout(120)

MAX_ATTEMPTS = 3
BACKOFF_CAP = 0.5  # the whole counted budget would be ~1.5 s: the outage lasts longer
OUTAGE = 4.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port} after {timeout}s")


class Server:
    """A broker process of our own: start(), stop(), start() again on the same port."""

    def __init__(self, argv: list[str], port: int) -> None:
        self.argv, self.port = argv, port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _wait_port(self.port)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None


def _need(binary: str) -> str:
    found = shutil.which(binary) or (
        f"/usr/sbin/{binary}" if Path(f"/usr/sbin/{binary}").exists() else None
    )
    if found is None:
        if IN_CI:
            pytest.fail(f"{binary} is not installed, and CI requires it")
        pytest.skip(f"{binary} is not installed")
    return found


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[Server]:
    port = _free_port()
    config = tmp_path / "nats.conf"
    config.write_text("max_payload: 65536\n")  # small, so a message can be too large
    server = Server(
        [_need("nats-server"), "-c", str(config), "-a", "127.0.0.1", "-p", str(port),
         "-js", "-sd", str(tmp_path)],
        port,
    )  # fmt: skip
    server.start()
    yield server
    server.stop()


REDIS_PASSWORD = "right-password"


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[Server]:
    port = _free_port()
    server = Server(
        [_need("redis-server"), "--bind", "127.0.0.1", "--port", str(port), "--dir",
         str(tmp_path), "--save", "", "--appendonly", "yes", "--appendfsync", "always",
         "--requirepass", REDIS_PASSWORD],
        port,
    )  # fmt: skip
    server.start()
    yield server
    server.stop()


def _write_rows(store: Any, topic: str, start: int, n: int) -> None:
    outbox = onceonly.Outbox(store)
    with store.transaction() as tx:
        for i in range(start, start + n):
            outbox.publish(tx.connection, topic, {"n": i})


async def _until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout}s")


@contextlib.asynccontextmanager
async def _relay(store: Any, publisher: Any) -> AsyncIterator[Any]:
    relay = onceonly.AsyncRelay(
        store.async_face,
        publisher,
        max_attempts=MAX_ATTEMPTS,
        backoff_base=0.1,
        backoff_cap=BACKOFF_CAP,
        poll_interval=0.1,
    )
    task = asyncio.create_task(relay.run())
    try:
        yield relay
    finally:
        relay.stop()
        await asyncio.wait_for(task, 30)
        await publisher.close()


class _Stores:
    """The sync store (to write rows and count) and its async face (for the relay)."""

    def __init__(self, factory: Any) -> None:
        self.sync = factory()
        self.sync.migrate()
        options = {"table": factory.table, "outbox_table": f"{factory.table}_outbox"}
        self.async_face = onceonly.open_async_store(factory.url, **options)
        self.sync.async_face = self.async_face


@pytest.fixture
async def stores(sql_store_factory: Any) -> AsyncIterator[_Stores]:
    made = _Stores(sql_store_factory)
    yield made
    await made.async_face.close()


async def _outage_run(store: Any, publisher: Any, broker: Server, count: Any) -> None:
    outbox = onceonly.Outbox(store)
    _write_rows(store, "orders", 0, 5)
    async with _relay(store, publisher):
        await _until(lambda: _async(outbox.counts()["pending"] == 0), 30, "the first rows")
        broker.stop()
        _write_rows(store, "orders", 5, 10)
        await asyncio.sleep(OUTAGE)
        assert outbox.counts()["dead"] == 0
        assert all(r.message.attempts == 0 for r in outbox.rows("pending", 100))
        broker.start()
        await _until(lambda: _async(outbox.counts()["pending"] == 0), 60, "the backlog")
    assert outbox.counts() == {"pending": 0, "dead": 0}
    assert await count() == 15


async def _async(value: Any) -> Any:
    return value


async def test_nats_outage_makes_no_row_dead(stores: _Stores, nats_server: Server) -> None:
    """NATS stopped for longer than the backoff budget: 0 dead, all 15 in the stream."""
    import nats

    url = f"nats://127.0.0.1:{nats_server.port}"
    prefix = f"t{uuid.uuid4().hex[:8]}."
    stream = prefix.rstrip(".").upper()

    async def setup() -> None:
        nc = await nats.connect(url)
        await nc.jetstream().add_stream(name=stream, subjects=[f"{prefix}>"])
        await nc.close()

    async def count() -> int:
        nc = await nats.connect(url)
        try:
            info = await nc.jetstream().stream_info(stream)
            return int(info.state.messages)
        finally:
            await nc.close()

    await setup()
    from onceonly.brokers.nats import NatsPublisher

    publisher = NatsPublisher(url, subject_prefix=prefix, timeout=1.0)
    await _outage_run(stores.sync, publisher, nats_server, count)


async def test_redis_outage_makes_no_row_dead(stores: _Stores, redis_server: Server) -> None:
    """Redis stopped for longer than the backoff budget: 0 dead, all 15 in the stream."""
    import redis.asyncio

    url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{redis_server.port}/0"
    prefix = f"t{uuid.uuid4().hex[:8]}:"

    async def count() -> int:
        client = redis.asyncio.Redis.from_url(url)
        try:
            return int(await client.xlen(f"{prefix}orders"))
        finally:
            await client.aclose()

    from onceonly.brokers.redis_streams import RedisStreamsPublisher

    publisher = RedisStreamsPublisher(url, stream_prefix=prefix, timeout=1.0)
    await _outage_run(stores.sync, publisher, redis_server, count)


async def test_a_message_nats_refuses_still_goes_dead(stores: _Stores, nats_server: Server) -> None:
    """Larger than the server's max_payload: permanent, dead after max_attempts."""
    import nats

    url = f"nats://127.0.0.1:{nats_server.port}"
    prefix = f"t{uuid.uuid4().hex[:8]}."
    nc = await nats.connect(url)
    await nc.jetstream().add_stream(name=prefix.rstrip(".").upper(), subjects=[f"{prefix}>"])
    await nc.close()
    outbox = onceonly.Outbox(stores.sync)
    with stores.sync.transaction() as tx:
        outbox.publish(tx.connection, "big", {"blob": "x" * 100_000})
    from onceonly.brokers.nats import NatsPublisher

    async with _relay(stores.sync, NatsPublisher(url, subject_prefix=prefix, timeout=1.0)):
        await _until(lambda: _async(outbox.counts()["dead"] == 1), 30, "the dead row")
    [dead] = outbox.rows("dead")
    assert dead.message.attempts == MAX_ATTEMPTS and "max_payload" in (dead.last_error or "")


async def test_a_relay_does_not_start_against_a_broker_it_cannot_reach(
    stores: _Stores, redis_server: Server
) -> None:
    """run() raises BrokerUnavailable at start-up (a refused port; a wrong password)."""
    from onceonly.brokers.redis_streams import RedisStreamsPublisher

    for url in (
        f"redis://127.0.0.1:{_free_port()}/0",  # nothing listens there
        f"redis://:wrong-password@127.0.0.1:{redis_server.port}/0",  # AUTH refused
    ):
        relay = onceonly.AsyncRelay(stores.async_face, RedisStreamsPublisher(url, timeout=2))
        started = time.monotonic()
        with pytest.raises(onceonly.BrokerUnavailable):
            await relay.run()
        assert time.monotonic() - started < 10
