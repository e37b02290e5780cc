# SPDX-License-Identifier: MIT
"""The process pool of a chaos run: one slot per producer, relay and consumer.

Each slot holds one process (``python -m chaos.worker``) at a time. A process that
exits is replaced: at once when the fault injector killed it, after a capped,
doubling delay when it died on its own quickly again (a relay crash-looping while the
database restarts), and never when a producer finished its share. Every exit is
counted, by role and by the reason its status file gives, so a process that dies on
a database blip shows up in the summary even though the run goes on.

Nothing here blocks: :meth:`Pool.tick` is called from the run's loop.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from chaos.spec import ROLES, Spec

__all__ = ["Pool", "Slot"]

REPO = Path(__file__).resolve().parent.parent
RESTART_DELAY = 0.25
RESTART_DELAY_CAP = 4.0
QUICK_EXIT = 5.0  # a process that fails within this long of its start backs off


def read_status(path: Path) -> dict[str, Any]:
    """A worker's last status; ``{}`` when it wrote none (or it is being replaced)."""
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return data
    except (OSError, ValueError):
        return {}


@dataclass
class Slot:
    """One place in the pool and the process that fills it."""

    role: str
    index: int
    proc: subprocess.Popen[bytes] | None = None
    incarnation: int = 0
    started_at: float = 0.0
    restart_at: float | None = 0.0  # None: not to be restarted (finished or stopping)
    quick_failures: int = 0
    finished: bool = False  # a producer that placed its whole share
    killed_pids: set[int] = field(default_factory=set)
    status_path: Path = field(default_factory=Path)  # of the current (or last) process

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Pool:
    """Starts, restarts, kills and stops the run's processes."""

    def __init__(self, spec: Spec, spec_path: Path, workdir: Path) -> None:
        self.spec = spec
        self.spec_path = spec_path
        self.status_dir = workdir / "status"
        self.log_dir = workdir / "logs"
        self.status_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        counts = {"producer": spec.producers, "relay": spec.relays, "consumer": spec.consumers}
        self.slots = [Slot(role, i) for role in ROLES for i in range(counts[role])]
        self.kills: Counter[str] = Counter()  # by role
        self.exits: Counter[tuple[str, str]] = Counter()  # (role, reason) of own exits
        self.starts: Counter[str] = Counter()
        self.totals: dict[str, Counter[str]] = {role: Counter() for role in ROLES}
        self.stopping = False
        self._logs: dict[str, IO[bytes]] = {}

    # -- queries
    def by_role(self, role: str) -> list[Slot]:
        return [s for s in self.slots if s.role == role]

    def producers_done(self) -> bool:
        return all(s.finished for s in self.by_role("producer"))

    def all_up(self) -> bool:
        """Every slot that should run has a live process."""
        return all(s.finished or s.alive() for s in self.slots)

    def status(self, slot: Slot) -> dict[str, Any]:
        return read_status(slot.status_path) if slot.proc is not None else {}

    def counts(self, role: str) -> Counter[str]:
        """The role's counters: exited processes plus the live ones' latest."""
        total = Counter(self.totals[role])
        for slot in self.by_role(role):
            if slot.alive():
                total.update(self.status(slot).get("counts", {}))
        return total

    # -- lifecycle
    def _start(self, slot: Slot, now: float) -> None:
        slot.incarnation += 1
        slot.status_path = self.status_dir / f"{slot.name}-{slot.incarnation}.json"
        log = self._logs.get(slot.name)
        if log is None:
            log = self._logs[slot.name] = open(self.log_dir / f"{slot.name}.log", "ab")  # noqa: SIM115
        log.write(f"--- {slot.name} #{slot.incarnation} at {time.time():.3f}\n".encode())
        log.flush()
        path = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
        slot.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "chaos.worker",
                slot.role,
                f"--spec={self.spec_path}",
                f"--slot={slot.index}",
                f"--status={slot.status_path}",
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        slot.started_at = now
        slot.restart_at = None
        self.starts[slot.role] += 1

    def _reap(self, slot: Slot, now: float) -> None:
        """Account for the exited process of ``slot`` and schedule its replacement."""
        proc = slot.proc
        assert proc is not None and proc.returncode is not None
        status = read_status(slot.status_path)
        self.totals[slot.role].update(status.get("counts", {}))
        code = proc.returncode
        killed = proc.pid in slot.killed_pids
        slot.killed_pids.discard(proc.pid)
        slot.proc = None
        if slot.role == "producer" and code == 0 and status.get("state") == "done":
            slot.finished = True
            return
        if self.stopping:
            return
        delay = 0.0
        if not killed:
            reason = str(status.get("error") or f"exit code {code}").split(":")[0]
            self.exits[(slot.role, reason)] += 1
            if now - slot.started_at < QUICK_EXIT:
                slot.quick_failures += 1
                delay = min(RESTART_DELAY_CAP, RESTART_DELAY * 2 ** (slot.quick_failures - 1))
            else:
                slot.quick_failures = 0
                delay = RESTART_DELAY
        slot.restart_at = now + delay

    def tick(self, now: float | None = None) -> None:
        """Reap exited processes and start the replacements that are due."""
        now = time.monotonic() if now is None else now
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is not None:
                self._reap(slot, now)
            if (
                slot.proc is None
                and not slot.finished
                and not self.stopping
                and slot.restart_at is not None
                and slot.restart_at <= now
            ):
                self._start(slot, now)

    def kill(self, slot: Slot) -> bool:
        """SIGKILL the process of ``slot`` (it is replaced at the next tick)."""
        proc = slot.proc
        if proc is None or proc.poll() is not None:
            return False
        slot.killed_pids.add(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        self.kills[slot.role] += 1
        return True

    def stop(self, roles: tuple[str, ...], timeout: float) -> list[str]:
        """SIGTERM the processes of ``roles``, wait up to ``timeout``, SIGKILL the rest.

        Returns:
            The names of the slots whose process had to be killed.
        """
        self.stopping = True
        targets = [s for s in self.slots if s.role in roles and s.alive()]
        for slot in targets:
            assert slot.proc is not None
            slot.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        stragglers = []
        for slot in targets:
            assert slot.proc is not None
            try:
                slot.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stragglers.append(slot.name)
                slot.killed_pids.add(slot.proc.pid)
                slot.proc.kill()
                slot.proc.wait()
            self._reap(slot, time.monotonic())
        return stragglers

    def close(self) -> None:
        """Kill whatever still runs; close the logs."""
        self.stopping = True
        for slot in self.slots:
            if slot.alive():
                assert slot.proc is not None
                slot.proc.kill()
                slot.proc.wait()
        for log in self._logs.values():
            log.close()
