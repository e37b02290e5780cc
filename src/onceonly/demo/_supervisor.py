# SPDX-License-Identifier: MIT
"""Runs one side of the demo: a pool of worker processes, SIGKILLed at random.

The supervisor starts ``workers`` processes, then, until the queue is drained, kills
a random one with SIGKILL at each of ``crashes`` random points of the drain (measured
in messages acked, so a fast and a slow machine see the same number of crashes) and
starts a replacement at once. A worker that exits on its own with an error is
replaced too, and counted. When the queue is empty the workers stop by themselves;
the side's time runs until the last one exits, since a worker whose lease ran out may
still be finishing a stale delivery.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess

from onceonly.demo._broker import Broker
from onceonly.demo._database import DemoError
from onceonly.demo._worker import WorkerSpec, worker_main

__all__ = ["SideRun", "run_side"]

POLL = 0.005
MAX_WORKER_FAILURES = 25
STOP_GRACE = 30.0

ProgressFn = Callable[[int, int, int], None]


@dataclass(frozen=True)
class SideRun:
    """What the supervisor observed.

    Attributes:
        seconds: wall time from the first worker's start to the last one's exit.
        crashes: SIGKILLs delivered.
        worker_failures: workers that exited with an error of their own.
        drained: false when the run hit its time limit with messages left.
        counters: the broker's counters (``deliveries``, ``skipped``, …).
    """

    seconds: float
    crashes: int
    worker_failures: int
    drained: bool
    counters: dict[str, int]


def _warm_up() -> None:
    """A process that does nothing (started once, so the fork server is up)."""


def _process_factory() -> Callable[..., BaseProcess]:
    """How workers are started: a fork server when the platform has one, else spawn.

    A fork server makes restarts cheap (a fork of a process that has already imported
    the worker) without inheriting the supervisor's connections. It is started here,
    before any side's clock runs.
    """
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["onceonly.demo._worker"])
        factory: Callable[..., BaseProcess] = ctx.Process
    else:
        factory = multiprocessing.get_context("spawn").Process
    proc = factory(target=_warm_up)
    proc.start()
    proc.join()
    return factory


def run_side(
    spec: WorkerSpec,
    *,
    workers: int,
    crashes: int,
    rng: random.Random,
    timeout: float,
    progress: ProgressFn,
) -> SideRun:
    """Drain the queue of ``spec`` with ``workers`` processes, killing ``crashes`` of them.

    Args:
        spec: what each worker runs.
        workers: the pool size.
        crashes: SIGKILLs to deliver, at random points of the drain (0: none).
        rng: decides the kill points and the victims.
        timeout: give up after this many seconds.
        progress: called with ``(acked, total, killed)`` as the queue drains.

    Returns:
        The :class:`SideRun`.

    Raises:
        DemoError: workers keep failing on their own (not from the SIGKILLs).
    """
    new_process = _process_factory()
    broker = Broker(spec.broker_path, spec.visibility_timeout)
    total = broker.remaining()
    kill_points = sorted(rng.random() * total for _ in range(crashes))
    killed = failures = 0

    def start() -> BaseProcess:
        proc = new_process(target=worker_main, args=(spec,), name=f"onceonly-demo-{spec.side}")
        proc.daemon = True
        proc.start()
        return proc

    started = time.monotonic()
    pool = [start() for _ in range(workers)]
    drained = False
    try:
        while True:
            remaining = broker.remaining()
            acked = total - remaining
            progress(acked, total, killed)
            if remaining == 0:
                drained = True
                break
            if time.monotonic() - started > timeout:
                break
            for i, proc in enumerate(pool):
                if proc.exitcode is not None:
                    failures += int(proc.exitcode != 0)
                    if failures > MAX_WORKER_FAILURES:
                        raise DemoError(
                            f"the {spec.side} workers keep failing (exit code {proc.exitcode});"
                            " see the errors above"
                        )
                    proc.join()
                    pool[i] = start()
            if killed < len(kill_points) and acked >= kill_points[killed]:
                i = rng.randrange(len(pool))
                victim = pool[i]
                if victim.pid is not None and victim.exitcode is None:
                    os.kill(victim.pid, signal.SIGKILL)
                    killed += 1
                    victim.join()
                    pool[i] = start()
            time.sleep(POLL)
        for proc in pool:
            proc.join(STOP_GRACE if drained else 0.0)
        seconds = time.monotonic() - started
    finally:
        for proc in pool:
            if proc.exitcode is None and proc.pid is not None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.join()
        counters = broker.counters()
        broker.close()
    return SideRun(seconds, killed, failures, drained, counters)
