# SPDX-License-Identifier: MIT
"""One chaos run, start to verdict.

1. **Setup**: a private PostgreSQL cluster (:mod:`chaos.pgcluster`), onceonly's tables
   (records, outbox, echo outbox) and the business tables, a RabbitMQ queue and its
   dead-letter queue with unique names (``--broker kafka``: a topic on Tansu and
   ``<topic>.dead``, :mod:`chaos.kafka`).
2. **Faults**: the pool (:mod:`chaos.supervisor`) runs the producers, relays and
   consumers while :mod:`chaos.faults` kills them, terminates their backends and
   restarts the database. Faults stop when the pipeline is done (every producer
   finished, every order has an effect, the outboxes are empty) and every enabled kind
   of fault struck at least once; or when it stalls (nothing moved for ``stall``
   seconds after the producers finished); or at the fault deadline.
3. **Drain**: no more faults; crashed processes are replaced at once. The run waits
   for quiescence: producers finished, every process up, nothing pending in the
   outboxes, nothing ready in the queue, and no counter moving for ``settle`` seconds.
   The drain is planned to end by the deadline (``seconds``), but it follows the
   pipeline's progress, not the clock (:mod:`chaos.headway`): past the deadline it
   keeps waiting while the pipeline makes headway, and gives up only when nothing
   progressed for ``stall`` seconds, or at the absolute cap (``max_seconds``). On a
   loaded machine the run takes longer instead of reporting slow messages as stuck.
4. **Stop**: relays and consumers get SIGTERM (a graceful stop; consumers settle what
   they hold and close their channels, so an unacknowledged delivery returns to the
   queue); what does not stop in time is killed and reported.
5. **Check** (:mod:`chaos.checker`) and the summary (:mod:`chaos.report`).

Every loop is bounded by the absolute cap (``max_seconds``, default three times
``seconds``): the run always ends by itself, with a verdict. Whatever happens, the
processes are killed, the queues deleted and the cluster stopped and removed.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import psycopg

import onceonly
from chaos import kafka as kafka_side
from chaos.checker import Findings, check, examples_of, read_queue
from chaos.faults import KINDS, Faults
from chaos.headway import Headway
from chaos.monitor import Monitor, Sample
from chaos.pgcluster import PgCluster, find_bindir
from chaos.spec import ECHO_OUTBOX, OUTBOX, RECORDS, SCHEMA, Spec
from chaos.supervisor import Pool
from tests.e2e._common import Names, cleanup_broker, prepare_broker, reachable

__all__ = ["ChaosError", "Options", "Result", "execute"]

TICK = 0.1
SAMPLE_EVERY = 1.0
STOP_TIMEOUT = 30.0
STARTUP_TIMEOUT = 60.0


class ChaosError(RuntimeError):
    """The run could not be set up (a service or a PostgreSQL binary is missing)."""


@dataclass(frozen=True)
class Options:
    """How to run (see ``python -m chaos --help``)."""

    messages: int = 100_000
    duplicates: float = 0.3
    producers: int = 2
    relays: int = 2
    consumers: int = 4
    concurrency: int = 8
    producer_concurrency: int = 8
    relay_batch: int = 50
    kill_every: float = 3.0
    terminate_every: float = 5.0
    pg_restart_every: float = 30.0
    kill_roles: tuple[str, ...] = ("consumer", "relay", "producer")
    terminate_roles: tuple[str, ...] = ("consumer",)
    seconds: float = 3600.0
    max_seconds: float | None = None  # the absolute cap; None: 3 * seconds
    settle: float = 3.0
    stall: float = 20.0
    seed: int = 1
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    broker: str = "rabbitmq"  # or "kafka" (Tansu: chaos.kafka)
    kafka_bootstrap: str = "127.0.0.1:9092"
    pg_bindir: str | None = None
    workdir: str | None = None
    keep: bool = False
    progress_every: float = 10.0


@dataclass
class Result:
    """What the run measured, for the report."""

    options: Options
    queue: str = ""
    pg_port: int = 0
    started: float = 0.0  # epoch
    seconds: dict[str, float] = field(default_factory=dict)  # phase -> duration
    produced_after: float | None = None  # seconds from start until producers were done
    consumed_after: float | None = None  # ... until every order had its effect
    quiescent: bool = False
    drain_end: str = ""  # "quiescent", "stalled" (no headway for `stall` s) or "cap"
    overtime: float = 0.0  # seconds the drain ran past the planned deadline, progressing
    stragglers: list[str] = field(default_factory=list)
    faults: dict[str, int] = field(default_factory=dict)
    kills: dict[str, int] = field(default_factory=dict)
    backends_terminated: int = 0
    restart_seconds: float = 0.0
    exits: dict[str, dict[str, int]] = field(default_factory=dict)
    assignments: int = 0  # Kafka: partitions assigned to a member (each rebalance moves some)
    starts: dict[str, int] = field(default_factory=dict)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    findings: Findings | None = None
    examples: dict[str, dict[str, Any]] = field(default_factory=dict)
    fault_log: list[dict[str, Any]] = field(default_factory=list)
    workdir: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.findings is not None and self.findings.ok


def _setup_database(cluster: PgCluster) -> None:
    url = cluster.url("chaos-setup")
    for outbox in (OUTBOX, ECHO_OUTBOX):
        store = onceonly.open_store(url, table=RECORDS, outbox_table=outbox)
        try:
            store.migrate()
        finally:
            store.close()
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in SCHEMA:
            conn.execute(statement)


class _Progress:
    def __init__(self, stream: TextIO, every: float, started: float) -> None:
        self.stream = stream
        self.every = every
        self.started = started
        self.last = 0.0

    def show(self, phase: str, sample: Sample | None, faults: Faults, pool: Pool) -> None:
        now = time.monotonic()
        if self.every <= 0 or now - self.last < self.every:
            return
        self.last = now
        s = sample
        counts = " ".join(f"{k} {n}" for k, n in sorted(faults.counts.items()))
        exits = sum(pool.exits.values())
        state = (
            f"orders {s.orders:,}  effects {s.effects:,} ({s.effected:,} msgs)  outbox "
            f"{s.outbox:,}  ready {s.ready:,}  unfinished {s.unfinished:,}"
            if s
            else "(database or broker unreachable)"
        )
        self.stream.write(
            f"[{now - self.started:6.1f}s] {phase:6} {state} | {counts or 'no faults'}"
            f" | own exits {exits}\n"
        )
        self.stream.flush()


async def _faults_phase(
    o: Options, pool: Pool, faults: Faults, monitor: Monitor, progress: _Progress,
    result: Result, t0: float, until: float,
) -> None:  # fmt: skip
    faults.start(time.monotonic())
    last_sample = 0.0
    moved_at = time.monotonic()
    signature: tuple[int, ...] | None = None
    while time.monotonic() < until:
        now = time.monotonic()
        pool.tick(now)
        await faults.tick(now)
        if now - last_sample >= SAMPLE_EVERY:
            last_sample = now
            sample = await monitor.sample()
            progress.show("faults", sample, faults, pool)
            done = pool.producers_done()
            if done and result.produced_after is None:
                result.produced_after = now - t0
            if sample is None:
                continue
            sig = (sample.orders, sample.effects, sample.outbox)
            if sig != signature:
                signature, moved_at = sig, now
            complete = done and sample.effected >= sample.orders and sample.outbox == 0
            if complete and result.consumed_after is None:
                result.consumed_after = now - t0
            struck = all(faults.counts[k] > 0 for k in faults.enabled)
            if struck and (complete or (done and now - moved_at > o.stall)):
                return
        await asyncio.sleep(TICK)


async def _drain_phase(
    o: Options, pool: Pool, faults: Faults, monitor: Monitor, progress: _Progress,
    result: Result, t0: float, until: float, cap: float,
) -> None:  # fmt: skip
    """Wait for quiescence: by ``until`` if the pipeline is that fast; past it while it
    makes headway; never past ``cap``."""
    last_sample = 0.0
    stable_since = time.monotonic()
    signature: tuple[Any, ...] | None = None
    headway = Headway(o.stall, stable_since)
    while True:
        now = time.monotonic()
        if now >= cap or (now >= until and headway.stalled(now)):
            result.drain_end = "cap" if now >= cap else "stalled"
            result.overtime = max(0.0, now - until)
            return
        pool.tick(now)
        if now - last_sample >= SAMPLE_EVERY / 2:
            last_sample = now
            sample = await monitor.sample()
            headway.observe(sample, now)
            progress.show("drain", sample, faults, pool)
            done = pool.producers_done()
            if done and result.produced_after is None:
                result.produced_after = now - t0
            activity = (
                sum(pool.counts("consumer").values()),
                sum(pool.counts("relay").values()),
                pool.all_up(),
            )
            sig = (sample, activity)
            if sample is None or sig != signature:
                signature, stable_since = sig, now
            if (
                sample is not None
                and done
                and sample.effected >= sample.orders
                and result.consumed_after is None
            ):
                result.consumed_after = now - t0
            if (
                sample is not None
                and done
                and pool.all_up()
                and sample.outbox == 0
                and sample.ready == 0
                and now - stable_since >= o.settle
            ):
                result.quiescent = True
                result.drain_end = "quiescent"
                result.overtime = max(0.0, now - until)
                return
        await asyncio.sleep(TICK)


async def execute(options: Options, stream: TextIO | None = None) -> Result:
    """Run the pipeline under faults and check it; see the module docstring.

    Raises:
        ChaosError: the broker or the PostgreSQL server binaries are missing.
    """
    o = options
    out = stream if stream is not None else sys.stderr
    begin = time.monotonic()
    deadline = begin + o.seconds
    cap = begin + max(o.seconds, o.max_seconds or 3 * o.seconds)
    stop_reserve = min(45.0, 0.15 * o.seconds)
    drain_reserve = min(90.0, 0.2 * o.seconds)
    bindir = find_bindir(o.pg_bindir)
    if bindir is None:
        raise ChaosError("PostgreSQL server binaries (initdb, pg_ctl) not found; see --pg-bindir")
    kafka = o.broker == "kafka"
    broker_url = f"kafka://{o.kafka_bootstrap}" if kafka else o.amqp_url
    if not await reachable(o.broker, broker_url):
        what = f"Kafka (Tansu) at {o.kafka_bootstrap}" if kafka else f"RabbitMQ at {o.amqp_url}"
        raise ChaosError(f"{what} is not reachable")
    workdir = Path(tempfile.mkdtemp(prefix="onceonly-chaos-", dir=o.workdir))
    result = Result(options=o, started=time.time(), workdir=str(workdir))
    names = Names(f"chaos_{secrets.token_hex(5)}")
    result.queue = names.topic
    cluster: PgCluster | None = None
    pool: Pool | None = None
    monitor: Monitor | None = None
    broker_ready = False
    try:
        cluster = PgCluster.create(bindir)
        result.pg_port = cluster.port
        _setup_database(cluster)
        if kafka:
            await kafka_side.create_topic(o.kafka_bootstrap, names.topic)
        await prepare_broker(o.broker, broker_url, names)
        broker_ready = True
        spec = Spec(
            pg_port=cluster.port,
            amqp_url=o.amqp_url,
            queue=names.topic,
            messages=o.messages,
            duplicates=o.duplicates,
            seed=o.seed,
            producers=o.producers,
            relays=o.relays,
            consumers=o.consumers,
            concurrency=o.concurrency,
            producer_concurrency=o.producer_concurrency,
            relay_batch=o.relay_batch,
            workdir=str(workdir),
            broker=o.broker,
            kafka_bootstrap=o.kafka_bootstrap,
        )
        spec_path = workdir / "spec.json"
        spec.save(spec_path)
        pool = Pool(spec, spec_path, workdir)
        rng = random.Random(o.seed)
        intervals = dict(
            zip(KINDS, (o.kill_every, o.terminate_every, o.pg_restart_every), strict=True)
        )
        faults = Faults(pool, cluster, intervals, o.kill_roles, o.terminate_roles, rng)
        monitor = Monitor(cluster.url("chaos-harness"), o.amqp_url, names.topic, o.broker)
        result.seconds["setup"] = time.monotonic() - begin
        out.write(
            f"chaos: {o.messages:,} messages, {o.duplicates:.0%} duplicates; private PostgreSQL"
            f" on 127.0.0.1:{cluster.port}; queue {names.topic}; work dir {workdir}\n"
        )
        t0 = time.monotonic()
        progress = _Progress(out, o.progress_every, t0)
        pool.tick(t0)
        # everyone up before the first fault (a process killed while importing proves little)
        while time.monotonic() - t0 < STARTUP_TIMEOUT and not all(
            pool.status(s).get("state") in ("running", "done") for s in pool.slots
        ):
            pool.tick()
            await asyncio.sleep(TICK)
        fault_until = max(t0, deadline - stop_reserve - drain_reserve)
        await _faults_phase(o, pool, faults, monitor, progress, result, t0, fault_until)
        t1 = time.monotonic()
        result.seconds["faults"] = t1 - t0
        await _drain_phase(
            o, pool, faults, monitor, progress, result, t0,
            deadline - stop_reserve, cap - stop_reserve,
        )  # fmt: skip
        t2 = time.monotonic()
        result.seconds["drain"] = t2 - t1
        await monitor.close()
        result.stragglers = pool.stop(("producer", "relay", "consumer"), STOP_TIMEOUT)
        result.seconds["stop"] = time.monotonic() - t2
        t3 = time.monotonic()
        if kafka:
            starts = kafka_side.stored_positions(cluster.url("chaos-check"), names.topic)
            queue = await kafka_side.read_topic(o.kafka_bootstrap, names.topic, starts)
            dead = await kafka_side.read_topic(o.kafka_bootstrap, names.dead)
            result.assignments = kafka_side.assignments(cluster.url("chaos-check"), names.topic)
        else:
            queue = await read_queue(o.amqp_url, names.topic)
            dead = await read_queue(o.amqp_url, names.dead)
        findings = check(cluster.url("chaos-check"), o.messages, queue, dead)
        result.findings = findings
        bad = [
            *sorted(findings.doubled_effects)[:5],
            *sorted(findings.lost)[:5],
            *sorted(m for m in findings.stuck if not m.startswith("<"))[:5],
        ]
        result.examples = examples_of(cluster.url("chaos-check"), bad)
        result.seconds["check"] = time.monotonic() - t3
        result.seconds["total"] = time.monotonic() - begin
        result.faults = dict(faults.counts)
        result.fault_log = [e.to_json() for e in faults.events]
        result.backends_terminated = faults.backends_terminated
        result.restart_seconds = faults.restart_seconds
        result.kills = dict(pool.kills)
        result.starts = dict(pool.starts)
        for (role, reason), n in pool.exits.items():
            result.exits.setdefault(role, {})[reason] = n
        result.counts = {
            role: dict(pool.counts(role)) for role in ("producer", "relay", "consumer")
        }
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        if monitor is not None:
            await monitor.close()
        if pool is not None:
            pool.close()
        if broker_ready:
            try:
                await cleanup_broker(o.broker, broker_url, names)
            except Exception as exc:  # do not hide the error that got us here
                out.write(f"chaos: could not delete the queues: {exc!r}\n")
        if cluster is not None:
            cluster.close()
        (workdir / "faults.json").write_text(json.dumps(result.fault_log), encoding="utf-8")
        if o.keep or not result.ok:
            out.write(f"chaos: kept {workdir} (logs/, status/, faults.json)\n")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return result
