# SPDX-License-Identifier: MIT
"""The faults a chaos run injects, on a jittered schedule, and the log of each one.

Kinds (each off when its interval is 0):

* ``sigkill`` — SIGKILL one random live process among the roles chosen (consumers,
  relays, producers by default); the pool restarts it at once;
* ``pg_terminate_backend`` — terminate a random half (at least one) of the PostgreSQL
  backends of the roles chosen (the consumers by default), found by their
  ``application_name`` (``chaos-<role>-<slot>``); the harness's own connections are
  never among them;
* ``pg_restart`` — an immediate restart of the run's own PostgreSQL cluster (every
  connection breaks, uncommitted transactions are lost, crash recovery runs).

Each interval is jittered (0.5x to 1.5x). Every fault is logged with its wall-clock
time, so the checker can say which fault came just before a violation.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg

from chaos.pgcluster import PgCluster, PgClusterError
from chaos.supervisor import Pool

__all__ = ["KINDS", "FaultEvent", "Faults"]

KINDS = ("sigkill", "pg_terminate_backend", "pg_restart")
HARNESS = "chaos-harness"


@dataclass(frozen=True)
class FaultEvent:
    """One injected fault: when (epoch seconds), what, and on what."""

    at: float
    kind: str
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at, "kind": self.kind, "detail": self.detail}


@dataclass
class Faults:
    """Decides when the next fault of each kind is due and injects it.

    Args:
        pool: the processes to kill.
        cluster: the PostgreSQL cluster to restart and whose backends to terminate.
        intervals: seconds between faults, per kind (0: never).
        kill_roles: which roles SIGKILL may hit.
        terminate_roles: whose backends pg_terminate_backend may hit.
        rng: decides the jitter and the victims.
    """

    pool: Pool
    cluster: PgCluster
    intervals: dict[str, float]
    kill_roles: tuple[str, ...]
    terminate_roles: tuple[str, ...]
    rng: random.Random
    events: list[FaultEvent] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    backends_terminated: int = 0
    restart_seconds: float = 0.0
    skipped: Counter[str] = field(default_factory=Counter)
    _due: dict[str, float] = field(default_factory=dict)

    @property
    def enabled(self) -> tuple[str, ...]:
        return tuple(k for k in KINDS if self.intervals.get(k, 0) > 0)

    def start(self, now: float) -> None:
        """Schedule the first fault of each kind."""
        for kind in self.enabled:
            self._schedule(kind, now)

    def _schedule(self, kind: str, now: float) -> None:
        self._due[kind] = now + self.intervals[kind] * self.rng.uniform(0.5, 1.5)

    async def tick(self, now: float) -> None:
        """Inject every fault that is due (at most one of each kind)."""
        for kind in self.enabled:
            if self._due.get(kind, float("inf")) > now:
                continue
            if kind == "sigkill":
                self._sigkill()
            elif kind == "pg_terminate_backend":
                await self._terminate()
            else:
                await self._restart()
            self._schedule(kind, time.monotonic())

    def _log(self, kind: str, detail: str, at: float | None = None) -> None:
        self.events.append(FaultEvent(time.time() if at is None else at, kind, detail))
        self.counts[kind] += 1

    def _sigkill(self) -> None:
        candidates = [s for s in self.pool.slots if s.role in self.kill_roles and s.alive()]
        if not candidates:
            self.skipped["sigkill"] += 1
            return
        victim = self.rng.choice(candidates)
        if self.pool.kill(victim):
            self._log("sigkill", victim.name)

    async def _terminate(self) -> None:
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.cluster.url(HARNESS), autocommit=True, connect_timeout=3
            )
        except psycopg.Error:
            self.skipped["pg_terminate_backend"] += 1  # the server is restarting
            return
        try:
            cur = await conn.execute(
                "SELECT pid, application_name FROM pg_stat_activity"
                " WHERE split_part(application_name, '-', 2) = ANY(%s)"
                " AND application_name LIKE 'chaos-%%' AND pid <> pg_backend_pid()",
                (list(self.terminate_roles),),
            )
            backends = await cur.fetchall()
            if not backends:
                self.skipped["pg_terminate_backend"] += 1
                return
            chosen = [b for b in backends if self.rng.random() < 0.5] or [self.rng.choice(backends)]
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid",
                ([int(b[0]) for b in chosen],),
            )
            self.backends_terminated += len(chosen)
            names = Counter(str(b[1]).removeprefix("chaos-").rsplit("-", 1)[0] for b in chosen)
            self._log(
                "pg_terminate_backend",
                ", ".join(f"{n} {role}" for role, n in sorted(names.items())),
            )
        except psycopg.Error:
            self.skipped["pg_terminate_backend"] += 1
        finally:
            await conn.close()

    async def _restart(self) -> None:
        started, at = time.monotonic(), time.time()
        try:
            await asyncio.to_thread(self.cluster.restart)
        except PgClusterError as exc:
            # The run cannot go on without its database: stop here, loudly.
            raise RuntimeError(f"the private PostgreSQL did not come back: {exc}") from exc
        took = time.monotonic() - started
        self.restart_seconds += took
        self._log("pg_restart", f"down and up in {took:.2f}s", at)
