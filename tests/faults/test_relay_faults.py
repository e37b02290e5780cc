# SPDX-License-Identifier: MIT
"""The outbox relay survives PostgreSQL blips (docs/spec.md §4): killed connections, a
crash-restart of the server, with the sync ``Relay``, the ``AsyncRelay`` and the
``onceonly relay`` process.

Each test runs on a private cluster (``pg_cluster``) and a real broker. The broker's
message id is the outbox row id, so the test counts distinct ids and duplicates on the
broker itself: every row must arrive exactly once (one relay: a row published before a
blip is settled afterwards without being published again).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import onceonly
import onceonly.testing
from onceonly.errors import PublishError
from onceonly.messaging import OutboxMessage
from tests.conftest import unavailable
from tests.faults.pgcluster import PgCluster

REDIS_URL = os.environ.get("ONCEONLY_TEST_REDIS", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("ONCEONLY_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
ROOT = Path(__file__).resolve().parents[2]
RELAY_APP = "onceonly-relay-under-test"  # the application_name of the relay's connections

pytestmark = pytest.mark.timeout(60)


# -- the broker side: Redis streams read back by id -------------------------------------


class RedisStreams:
    """A unique stream prefix on the real Redis; reads back what arrived, by row id."""

    def __init__(self) -> None:
        import redis

        self.client = redis.Redis.from_url(REDIS_URL)
        try:
            self.client.ping()
        except Exception:
            unavailable(f"Redis at {REDIS_URL}")
        self.prefix = f"onceonly-faults-{uuid.uuid4().hex[:8]}:"

    def ids(self, topic: str = "events") -> list[str]:
        entries = self.client.xrange(f"{self.prefix}{topic}")
        return [fields[b"id"].decode() for _, fields in entries]

    def close(self) -> None:
        keys = self.client.keys(f"{self.prefix}*")
        if keys:
            self.client.delete(*keys)
        self.client.close()


class SyncRedisPublisher:
    """A sync publisher (the sync ``Relay`` needs one): XADD with the row id as ``id``."""

    def __init__(self, streams: RedisStreams) -> None:
        self.streams = streams

    def publish(self, message: OutboxMessage) -> None:
        try:
            self.streams.client.xadd(
                f"{self.streams.prefix}{message.topic}",
                {"id": message.id, "payload": message.payload},
            )
        except Exception as exc:
            raise PublishError(f"XADD failed: {exc}", key=message.id) from exc

    def close(self) -> None:
        """The client belongs to the test."""


@pytest.fixture
def streams() -> Iterator[RedisStreams]:
    s = RedisStreams()
    yield s
    s.close()


# -- the database side ------------------------------------------------------------------


def _outbox_store(cluster: PgCluster) -> Any:
    """A migrated store on the cluster for the test's own writes (not the relay's)."""
    store = onceonly.open_store(cluster.url(application_name="writer"))
    store.migrate()
    return store


def write_rows(store: Any, n: int, *, pause: float = 0.0, start: int = 0) -> list[str]:
    """Write ``n`` outbox rows, one transaction each; their ids."""
    outbox = onceonly.Outbox(store)
    ids = []
    for i in range(start, start + n):
        with store.transaction() as session:
            ids.append(outbox.publish(session.connection, "events", {"i": i}))
        if pause:
            time.sleep(pause)
    return ids


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def assert_exactly_once(published: list[str], written: list[str]) -> None:
    counts = collections.Counter(published)
    duplicates = {k: n for k, n in counts.items() if n > 1}
    assert not duplicates, f"{len(duplicates)} rows published more than once"
    missing = set(written) - set(counts)
    assert not missing, f"{len(missing)} rows never published"
    assert set(counts) == set(written)


class Killer(threading.Thread):
    """Terminates the relay's backends (LISTEN and batch connections) every ``every``
    seconds until stopped; counts the rounds that killed something."""

    def __init__(self, cluster: PgCluster, every: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.every = every
        self.kills = 0
        self.rounds_with_kills = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.every):
            killed = self.cluster.terminate_backends(application_name=RELAY_APP)
            self.kills += killed
            self.rounds_with_kills += killed > 0

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


class RelayThread(threading.Thread):
    """Runs a sync relay; keeps what ended it (an exception ends the test's hopes)."""

    def __init__(self, relay: onceonly.Relay) -> None:
        super().__init__(daemon=True)
        self.relay = relay
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.relay.run()
        except BaseException as exc:
            self.error = exc

    def finish(self) -> None:
        self.relay.stop()
        self.join(15)
        assert not self.is_alive(), "the relay did not stop"


def _relay_warnings(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "onceonly.relay" and r.levelno == level
    ]


# -- (a) connections terminated in a loop -----------------------------------------------


def test_sync_relay_survives_terminated_connections(
    pg_cluster: PgCluster, streams: RedisStreams
) -> None:
    """Relay: its backends killed every 0.25 s while rows are written; each row once."""
    writer = _outbox_store(pg_cluster)
    relay_store = onceonly.open_store(pg_cluster.url(application_name=RELAY_APP))
    relay = onceonly.Relay(relay_store, SyncRedisPublisher(streams), batch_size=20)
    runner = RelayThread(relay)
    killer = Killer(pg_cluster)
    try:
        runner.start()
        killer.start()
        written = write_rows(writer, 300, pause=0.01)
        time.sleep(0.5)  # a few more kills with nothing left to write
        killer.stop()
        wait_for(lambda: len(set(streams.ids())) >= len(written), 40, "every row published")
        assert runner.is_alive(), f"the relay died: {runner.error!r}"
        wait_for(lambda: relay.stats.published == len(written), 5, "the last deletes")
    finally:
        killer.stop()
        runner.finish()
        relay_store.close()
    assert runner.error is None
    assert killer.rounds_with_kills >= 3  # the relay really lost its connections
    assert_exactly_once(streams.ids(), written)
    assert (relay.stats.failed, relay.stats.dead) == (0, 0)  # no broker failure counted
    assert onceonly.Outbox(writer).counts() == {"pending": 0, "dead": 0}
    writer.close()


async def test_async_relay_survives_terminated_connections(pg_cluster: PgCluster) -> None:
    """AsyncRelay to RabbitMQ: backends killed in a loop while rows are written; once each."""
    import aio_pika

    from onceonly.brokers.rabbitmq import RabbitMQPublisher

    try:
        amqp = await asyncio.wait_for(aio_pika.connect(AMQP_URL), 5)
    except Exception:
        unavailable(f"RabbitMQ at {AMQP_URL}")
    queue_name = f"onceonly-faults-{uuid.uuid4().hex[:10]}"
    channel = await amqp.channel()
    queue = await channel.declare_queue(queue_name, durable=True)
    writer = _outbox_store(pg_cluster)
    store = onceonly.open_async_store(pg_cluster.url(application_name=RELAY_APP))
    publisher = RabbitMQPublisher(AMQP_URL, timeout=5.0)
    relay = onceonly.AsyncRelay(store, publisher, batch_size=20)
    task = asyncio.ensure_future(relay.run())
    killer = Killer(pg_cluster)
    try:
        killer.start()
        written = await asyncio.to_thread(write_rows_to, writer, 300, queue_name)
        await asyncio.sleep(0.5)
        killer.stop()
        deadline = time.monotonic() + 40  # generous: a loaded CI machine backs off longer
        while relay.stats.published < len(written) and time.monotonic() < deadline:
            assert not task.done(), f"the relay died: {task.exception()!r}"
            await asyncio.sleep(0.05)
        assert not task.done(), f"the relay died: {task.exception()!r}"
        relay.stop()
        await asyncio.wait_for(task, 15)
        published = []
        while (message := await queue.get(no_ack=True, fail=False, timeout=5)) is not None:
            published.append(message.message_id)
    finally:
        killer.stop()
        relay.stop()
        if not task.done():
            task.cancel()
        await publisher.close()
        await store.close()
        await queue.delete(if_unused=False, if_empty=False)
        await amqp.close()
    assert killer.rounds_with_kills >= 3
    assert_exactly_once(published, written)
    assert (relay.stats.failed, relay.stats.dead) == (0, 0)
    assert onceonly.Outbox(writer).counts() == {"pending": 0, "dead": 0}
    writer.close()


def write_rows_to(store: Any, n: int, topic: str) -> list[str]:
    """Like :func:`write_rows`, to ``topic``."""
    outbox = onceonly.Outbox(store)
    ids = []
    for i in range(n):
        with store.transaction() as session:
            ids.append(outbox.publish(session.connection, topic, {"i": i}))
        time.sleep(0.01)
    return ids


# -- a batch whose delete is lost after the broker confirmed it -------------------------


class KillingPublisher(onceonly.testing.ListPublisher):
    """Keeps messages; at its first publish it terminates the relay's backends, so the
    batch's transaction (its row locks and its delete to come) is lost."""

    def __init__(self, cluster: PgCluster) -> None:
        super().__init__()
        self.cluster = cluster
        self.killed = 0

    def publish(self, message: OutboxMessage) -> None:
        if not self.killed:
            self.killed = self.cluster.terminate_backends(application_name=RELAY_APP)
        super().publish(message)


def test_lost_delete_is_retried_without_a_second_publish(pg_cluster: PgCluster) -> None:
    """run_once raises StoreUnavailable, the rows stay pending with no attempt counted,
    and the next batch deletes them without publishing them again."""
    writer = _outbox_store(pg_cluster)
    written = write_rows(writer, 5)
    store = onceonly.open_store(pg_cluster.url(application_name=RELAY_APP))
    publisher = KillingPublisher(pg_cluster)
    relay = onceonly.Relay(store, publisher)
    try:
        with pytest.raises(onceonly.StoreUnavailable):
            relay.run_once()
        assert publisher.killed >= 1
        pending = onceonly.Outbox(writer).rows("pending")
        assert sorted(r.message.id for r in pending) == sorted(written)
        assert all(r.message.attempts == 0 and r.last_error is None for r in pending)
        deadline = time.monotonic() + 10
        stats = onceonly.RelayStats()
        while stats.published < 5 and time.monotonic() < deadline:
            try:  # the pool may still hand out a connection killed with the batch's
                stats.add(relay.run_once())
            except onceonly.StoreUnavailable:
                time.sleep(0.05)
    finally:
        store.close()
    assert (stats.published, stats.failed, stats.dead) == (5, 0, 0)
    assert_exactly_once([m.id for m in publisher.messages], written)
    assert onceonly.Outbox(writer).counts() == {"pending": 0, "dead": 0}
    writer.close()


# -- (b) an immediate (crash) restart of the server -------------------------------------


def test_sync_relay_recovers_from_a_server_restart(
    pg_cluster: PgCluster, streams: RedisStreams, caplog: pytest.LogCaptureFixture
) -> None:
    """Relay: the server crashes and restarts; rows written afterwards are published;
    one warning for the outage, one info line for the recovery."""
    caplog.set_level(logging.INFO, logger="onceonly.relay")
    writer = _outbox_store(pg_cluster)
    relay_store = onceonly.open_store(pg_cluster.url(application_name=RELAY_APP))
    relay = onceonly.Relay(relay_store, SyncRedisPublisher(streams), poll_interval=5.0)
    runner = RelayThread(relay)
    try:
        runner.start()
        before = write_rows(writer, 30)
        wait_for(lambda: len(streams.ids()) >= 30, 10, "the rows before the restart")
        writer.close()
        pg_cluster.restart(mode="immediate", down_for=1.5)  # a few retry spins
        writer = _outbox_store(pg_cluster)
        after = write_rows(writer, 30, start=30)
        wait_for(lambda: len(streams.ids()) >= 60, 15, "the rows after the restart")
        assert runner.is_alive(), f"the relay died: {runner.error!r}"
    finally:
        runner.finish()
        relay_store.close()
    assert runner.error is None
    assert_exactly_once(streams.ids(), before + after)
    assert (relay.stats.failed, relay.stats.dead) == (0, 0)
    assert len(_relay_warnings(caplog, logging.WARNING)) == 1
    assert len([m for m in _relay_warnings(caplog, logging.INFO) if "back" in m]) == 1
    writer.close()


async def test_async_relay_recovers_from_a_server_restart(
    pg_cluster: PgCluster, streams: RedisStreams
) -> None:
    """AsyncRelay: the server crashes mid-stream and restarts; every row once."""
    from onceonly.brokers.redis_streams import RedisStreamsPublisher

    writer = _outbox_store(pg_cluster)
    store = onceonly.open_async_store(pg_cluster.url(application_name=RELAY_APP))
    publisher = RedisStreamsPublisher(REDIS_URL, stream_prefix=streams.prefix, timeout=5.0)
    relay = onceonly.AsyncRelay(store, publisher, batch_size=10)
    task = asyncio.ensure_future(relay.run())
    try:
        before = await asyncio.to_thread(write_rows, writer, 100)
        writer.close()
        await asyncio.to_thread(pg_cluster.restart, "immediate")  # likely mid-batch
        # off the event loop: its migrate() may wait for a lock of the relay's running
        # transaction, which only this loop can finish
        writer = await asyncio.to_thread(_outbox_store, pg_cluster)
        after = await asyncio.to_thread(write_rows, writer, 30, start=100)
        deadline = time.monotonic() + 40  # generous: a loaded CI machine backs off longer
        while len(set(streams.ids())) < 130 and time.monotonic() < deadline:
            assert not task.done(), f"the relay died: {task.exception()!r}"
            await asyncio.sleep(0.05)
        assert not task.done(), f"the relay died: {task.exception()!r}"
        deadline = time.monotonic() + 5
        while relay.stats.published < 130 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        relay.stop()
        await asyncio.wait_for(task, 15)
    finally:
        relay.stop()
        if not task.done():
            task.cancel()
        await publisher.close()
        await store.close()
    assert_exactly_once(streams.ids(), before + after)
    assert (relay.stats.published, relay.stats.failed, relay.stats.dead) == (130, 0, 0)
    assert onceonly.Outbox(writer).counts() == {"pending": 0, "dead": 0}
    writer.close()


# -- (c) the relay process --------------------------------------------------------------


def test_relay_process_survives_a_server_restart(
    pg_cluster: PgCluster, streams: RedisStreams
) -> None:
    """`onceonly relay` keeps publishing across a crash-restart and exits 0 on SIGTERM."""
    writer = _outbox_store(pg_cluster)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "onceonly.cli",
            "relay",
            "--url",
            pg_cluster.url(application_name=RELAY_APP),
            "--broker",
            REDIS_URL,
            "--prefix",
            streams.prefix,
        ],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        before = write_rows(writer, 20)
        wait_for(lambda: len(streams.ids()) >= 20, 15, "the rows before the restart")
        writer.close()
        pg_cluster.restart(mode="immediate", down_for=0.5)
        writer = _outbox_store(pg_cluster)
        after = write_rows(writer, 20, start=20)
        wait_for(lambda: len(streams.ids()) >= 40, 15, "the rows after the restart")
        assert proc.poll() is None, "the relay process exited"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert_exactly_once(streams.ids(), before + after)
    assert "published 40" in err
    assert err.count("the database is unavailable") == 1, err  # once per outage
    assert err.count("the database is back") == 1, err
    writer.close()
