# SPDX-License-Identifier: MIT
"""End to end on the real brokers: outbox -> relay -> broker -> inbox consumer -> ledger.

Service A (this test) writes each business event and its outbox row in one PostgreSQL
transaction. Relays (``_relay.py``) publish the outbox to RabbitMQ, NATS JetStream,
Redis Streams, SQS (moto_server: a real HTTP process started by the test, since no SQS
runs on these machines) or Kafka (Tansu, a Kafka-compatible broker); service B
(``_consumer.py``) consumes through an ``AsyncInbox`` and inserts each event id into a
ledger with no unique constraint. Faults are injected with SIGKILL, a second relay and a
TCP proxy whose connections are dropped mid-stream.

For every broker and fault: each event is in the ledger exactly once, none is lost, the
outbox is empty, and the fault really happened (and produced the duplicate the inbox had
to absorb, where it should).
"""

from __future__ import annotations

import asyncio
import collections
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import onceonly
from tests.conftest import PG_URL, require_postgres, unavailable
from tests.e2e import _common
from tests.e2e._common import BROKER_URLS, Names, read_json
from tests.e2e._proxy import TcpProxy

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

N = 200  # business events per test
KILL_AT = N // 3  # the confirmed publish / the ack on which a process is killed
WAIT = 60.0  # seconds the pipeline gets to deliver everything
SETTLE = 1.0  # seconds the ledger must stay at N before the checks
REPO = Path(__file__).resolve().parents[2]

_reachable: dict[str, bool] = {}


class Proc:
    """A helper process (``python -m tests.e2e.<module>``) with its log and status file."""

    def __init__(self, module: str, tag: str, tmp: Path, args: list[str]) -> None:
        self.tag = tag
        self.status_path = tmp / f"{tag}.json"
        self.log_path = tmp / f"{tag}.log"
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    f"tests.e2e.{module}",
                    *args,
                    f"--status={self.status_path}",
                ],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    @property
    def status(self) -> dict[str, Any]:
        return read_json(str(self.status_path))

    def log(self, tail: int = 4000) -> str:
        return f"--- {self.tag} log ---\n{self.log_path.read_text(errors='replace')[-tail:]}"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.tag} did not exit within {timeout}s\n{self.log()}")

    def stop(self) -> int:
        """SIGTERM (a graceful stop), then the exit code."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
        return self.wait_exit(30)

    def kill(self) -> None:
        if self.alive():
            self.popen.kill()
            self.popen.wait(10)


class Pipeline:
    """Service A's tables, the broker's queue or stream, and the helper processes."""

    def __init__(self, broker: str, tmp: Path) -> None:
        self.broker = broker
        self.url = BROKER_URLS[broker]
        self.tmp = tmp
        self.names = Names(f"e2e_{uuid.uuid4().hex[:10]}")
        self.procs: list[Proc] = []
        self.proxies: list[TcpProxy] = []
        self.store: Any = None

    # -- setup and teardown
    def setup(self) -> None:
        n = self.names
        self.store = onceonly.open_store(PG_URL, table=n.records, outbox_table=n.outbox)
        self.store.migrate()  # the inbox's records and the outbox
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {n.events} (event_id text PRIMARY KEY)")
            conn.execute(f"CREATE TABLE {n.ledger} (event_id text NOT NULL)")  # not unique
        asyncio.run(_common.prepare_broker(self.broker, self.url, n))

    def teardown(self) -> None:
        for proc in self.procs:
            proc.kill()
        for proxy in self.proxies:
            proxy.close()
        if self.store is not None:
            self.store.close()
        n = self.names
        try:
            asyncio.run(_common.cleanup_broker(self.broker, self.url, n))
        finally:
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                for table in (n.events, n.ledger, n.records, n.outbox, n.kafka_positions):
                    conn.execute(f"DROP TABLE IF EXISTS {table}")
                conn.execute(f"DROP FUNCTION IF EXISTS {n.outbox}_notify()")
                if conn.execute("SELECT to_regclass('onceonly_schema')").fetchone()[0]:  # type: ignore[index]
                    conn.execute(
                        "DELETE FROM onceonly_schema WHERE component = ANY(%s)",
                        ([f"records:{n.records}", f"outbox:{n.outbox}"],),
                    )

    # -- processes
    def relay(self, tag: str, *, kill_after: int = 0, via: TcpProxy | None = None) -> Proc:
        url = _common.via(self.url, via.port) if via else self.url
        args = [f"--prefix={self.names.prefix}", f"--broker={self.broker}", f"--pg={PG_URL}"]
        args += [f"--broker-url={url}", "--batch-size=20", f"--kill-after={kill_after}"]
        return self._spawn("_relay", tag, args)

    def consumer(self, tag: str, *, kill_on_ack: int = 0, via: TcpProxy | None = None) -> Proc:
        url = _common.via(self.url, via.port) if via else self.url
        args = [f"--prefix={self.names.prefix}", f"--broker={self.broker}", f"--pg={PG_URL}"]
        args += [f"--broker-url={url}", f"--member={tag}", f"--kill-on-ack={kill_on_ack}"]
        return self._spawn("_consumer", tag, args)

    def _spawn(self, module: str, tag: str, args: list[str]) -> Proc:
        proc = Proc(module, tag, self.tmp, args)
        self.procs.append(proc)
        return proc

    def proxy(self) -> TcpProxy:
        proxy = TcpProxy(*_common.host_port(self.url)).start()
        self.proxies.append(proxy)
        return proxy

    # -- service A
    def write_events(self, n: int = N, first: int = 0, pace: float = 0.0) -> threading.Thread:
        """Write events ``first``..``first + n - 1``, each with its outbox row in one
        transaction, in a thread."""
        errors: list[BaseException] = []

        def run() -> None:
            outbox = onceonly.Outbox(self.store)
            try:
                with psycopg.connect(PG_URL, autocommit=True) as conn:
                    for i in range(first, first + n):
                        event_id = f"evt-{i:04d}"
                        with conn.transaction():
                            conn.execute(
                                f"INSERT INTO {self.names.events} (event_id) VALUES (%s)",
                                (event_id,),
                            )
                            outbox.publish(conn, self.names.topic, {"event_id": event_id})
                        if pace:
                            time.sleep(pace)
            except BaseException as exc:
                errors.append(exc)
                raise

        thread = threading.Thread(target=run, daemon=True)
        thread.errors = errors  # type: ignore[attr-defined]
        thread.start()
        return thread

    # -- observations
    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            return conn.execute(sql).fetchall()

    def ledger(self) -> list[str]:
        return [r[0] for r in self.query(f"SELECT event_id FROM {self.names.ledger}")]

    def ledger_count(self) -> int:
        return int(self.query(f"SELECT count(*) FROM {self.names.ledger}")[0][0])

    def events(self) -> list[str]:
        return [r[0] for r in self.query(f"SELECT event_id FROM {self.names.events}")]

    def outbox_count(self) -> int:
        return int(self.query(f"SELECT count(*) FROM {self.names.outbox}")[0][0])

    def logs(self) -> str:
        return "\n".join(p.log() for p in self.procs)

    def wait_for(
        self,
        what: str,
        done: Callable[[], bool],
        alive: list[Proc],
        timeout: float = WAIT,
        tick: Callable[[], None] | None = None,
    ) -> None:
        """Poll ``done`` until true; fail at ``timeout`` or when a process in ``alive`` died."""
        deadline = time.monotonic() + timeout
        while not done():
            for proc in alive:
                if not proc.alive():
                    pytest.fail(
                        f"{proc.tag} exited ({proc.popen.returncode}) while {what}\n{self.logs()}"
                    )
            if time.monotonic() > deadline:
                pytest.fail(
                    f"timed out after {timeout}s waiting for {what}: ledger "
                    f"{self.ledger_count()}/{N}, outbox {self.outbox_count()}, statuses "
                    f"{ {p.tag: p.status for p in self.procs} }\n{self.logs()}"
                )
            if tick is not None:
                tick()
            time.sleep(0.05)

    def wait_delivered(
        self, writer: threading.Thread, alive: list[Proc], also: Callable[[], bool] = lambda: True
    ) -> None:
        """Wait until A wrote everything, the outbox is empty, the ledger holds N rows and
        ``also`` holds (or the ledger overflowed), then SETTLE seconds more."""
        writer.join(WAIT)
        assert not writer.is_alive() and not writer.errors, writer.errors  # type: ignore[attr-defined]

        def delivered() -> bool:
            count = self.ledger_count()
            return count > N or (count == N and self.outbox_count() == 0 and also())

        self.wait_for("every event in the ledger", delivered, alive)
        time.sleep(SETTLE)  # anything still coming would show up as a duplicate

    def assert_exactly_once(self) -> None:
        ledger, events = self.ledger(), self.events()
        assert len(events) == N
        doubled = {e: c for e, c in collections.Counter(ledger).items() if c > 1}
        assert not doubled, f"events in the ledger more than once: {doubled}"
        assert sorted(ledger) == sorted(events), f"lost: {sorted(set(events) - set(ledger))}"
        assert self.outbox_count() == 0


@pytest.fixture(params=_common.BROKERS)
def pipeline(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pipeline]:
    yield from _pipeline(request.param, tmp_path)


#: Kafka is left out where a lost acknowledgement is the fault: its consumer's position
#: commits with the effects (nothing comes back to absorb; tests/brokers/test_kafka.py
#: kills it mid-batch), and a proxy must be the broker's advertised listener
#: (test_kafka.py runs its own Tansu behind one).
ACKED = tuple(b for b in _common.BROKERS if b != "kafka")


@pytest.fixture(params=ACKED)
def acked_pipeline(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pipeline]:
    yield from _pipeline(request.param, tmp_path)


def _pipeline(broker: str, tmp_path: Path) -> Iterator[Pipeline]:
    require_postgres()
    if broker == "sqs" and not BROKER_URLS[broker]:
        from tests.brokers._kits import moto_endpoint

        BROKER_URLS[broker] = moto_endpoint()  # moto_server: a real process, not SQS
    if broker not in _reachable:
        _reachable[broker] = asyncio.run(_common.reachable(broker, BROKER_URLS[broker]))
    if not _reachable[broker]:
        unavailable(f"{broker} at {BROKER_URLS[broker]}")
    p = Pipeline(broker, tmp_path)
    try:
        p.setup()
        yield p
    finally:
        p.teardown()


def ready(p: Pipeline, *procs: Proc) -> None:
    p.wait_for(
        "the helper processes to start",
        lambda: all(proc.status.get("state") for proc in procs),
        list(procs),
        timeout=30,
    )


def test_relay_killed_after_confirm(pipeline: Pipeline) -> None:
    """A relay SIGKILLed between the broker's confirm and the delete republishes; B writes once."""
    p = pipeline
    consumer = p.consumer("consumer")
    first = p.relay("relay-1", kill_after=KILL_AT)
    ready(p, consumer, first)
    writer = p.write_events()

    assert first.wait_exit(WAIT) == -signal.SIGKILL, first.log()
    second = p.relay("relay-2")
    # the republished rows reach B as duplicates, which its inbox replays
    p.wait_delivered(
        writer, [consumer, second], also=lambda: consumer.status.get("replayed", 0) >= 1
    )

    assert second.stop() == 0, second.log()
    assert consumer.stop() == 0, consumer.log()
    p.assert_exactly_once()
    assert consumer.status["replayed"] >= 1  # the republish reached B and was absorbed
    assert consumer.status["processed"] == N  # the handler committed once per event
    assert second.status["published"] >= 1


def test_consumer_killed_before_ack(acked_pipeline: Pipeline) -> None:
    """A consumer SIGKILLed between its inbox commit and the ack is redelivered; B writes once."""
    p = acked_pipeline
    first = p.consumer("consumer-1", kill_on_ack=KILL_AT)
    relay = p.relay("relay")
    ready(p, first, relay)
    writer = p.write_events()

    assert first.wait_exit(WAIT) == -signal.SIGKILL, first.log()
    committed_before = p.ledger_count()  # the K-th ack follows the K-th commit
    second = p.consumer("consumer-2")
    # the message whose ack was lost comes back: the restarted consumer replays it
    p.wait_delivered(writer, [second, relay], also=lambda: second.status.get("replayed", 0) >= 1)

    assert second.stop() == 0, second.log()
    assert relay.stop() == 0, relay.log()
    p.assert_exactly_once()
    assert committed_before >= KILL_AT
    assert second.status["replayed"] >= 1  # the message whose ack was lost came back
    assert relay.status["published"] == N  # from the broker: the relay published each once


def test_two_relays_at_once(pipeline: Pipeline) -> None:
    """Two relays drain one outbox side by side; each row is published by one of them, once."""
    p = pipeline
    consumer = p.consumer("consumer")
    relays = [p.relay("relay-a"), p.relay("relay-b")]
    ready(p, consumer, *relays)
    writer = p.write_events()

    p.wait_delivered(writer, [consumer, *relays])

    for relay in relays:
        assert relay.stop() == 0, relay.log()
    assert consumer.stop() == 0, consumer.log()
    p.assert_exactly_once()
    published = [relay.status["published"] for relay in relays]
    assert all(n >= 1 for n in published), published  # both really relayed
    assert sum(published) == N, published  # and never the same row twice
    assert consumer.status["processed"] == N


def test_broker_connection_dropped_mid_batch(acked_pipeline: Pipeline) -> None:
    """Broker connections dropped mid-stream (a confirm and an ack lost) double and lose nothing."""
    p = acked_pipeline
    relay_proxy, consumer_proxy = p.proxy(), p.proxy()
    consumer = p.consumer("consumer", via=consumer_proxy)
    relay = p.relay("relay", via=relay_proxy)
    ready(p, consumer, relay)
    first_half = p.write_events(N // 2)
    first_half.join(WAIT)
    assert not first_half.is_alive() and not first_half.errors  # type: ignore[attr-defined]

    # On the next publish the broker stores the message but its confirmation is lost; on
    # B's next request (an ack, a fetch) the broker hears nothing more; then every
    # connection of each is reset.
    relay_proxy.arm(lose="replies")
    consumer_proxy.arm(lose="requests")
    second_half = p.write_events(N - N // 2, first=N // 2, pace=0.005)
    p.wait_for(
        "the proxies to drop the connections",
        lambda: relay_proxy.dropped > 0 and consumer_proxy.dropped > 0,
        [consumer, relay],
    )
    in_ledger_at_drop = p.ledger_count()
    # the relay publishes the unconfirmed message again: B's inbox replays the duplicate
    p.wait_delivered(
        second_half, [consumer, relay], also=lambda: consumer.status.get("replayed", 0) >= 1
    )

    assert relay.stop() == 0, relay.log()
    assert consumer.stop() == 0, consumer.log()
    p.assert_exactly_once()
    assert in_ledger_at_drop < N  # mid-stream, not after the end
    assert relay_proxy.accepted_after_drop >= 1  # both reconnected and carried on
    assert consumer_proxy.accepted_after_drop >= 1
    assert consumer.status["replayed"] >= 1
    assert consumer.status["processed"] == N
