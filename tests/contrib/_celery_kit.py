# SPDX-License-Identifier: MIT
"""Real Celery workers for the tests: one module's broker queue, tables and Redis prefix."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import redis

import onceonly
from tests.conftest import PG_URL, REDIS_URL, drop_pg_table, drop_redis_prefix, unique_table
from tests.contrib.celery_app import build

ROOT = Path(__file__).resolve().parents[2]


class Kit:
    """A module's Celery world: its app (the test side), workers, tables and keys."""

    def __init__(self, broker: str, tmp: Path) -> None:
        tag = uuid.uuid4().hex[:10]
        self.table = unique_table()
        self.prefix = f"oo-celery-{tag}:"
        self.cfg: dict[str, Any] = {
            "broker": broker,
            "backend": REDIS_URL,
            "queue": f"oo-celery-{tag}",
            "pg": PG_URL,
            "table": self.table,
            "prefix": self.prefix,
            "redis": REDIS_URL,
            "markers": str(tmp),
        }
        self.tmp = tmp
        self.app = build(self.cfg)
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.store = onceonly.open_store(
            PG_URL, table=self.table, outbox_table=f"{self.table}_outbox", migrate=True
        )
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {self.table}_biz (tag TEXT NOT NULL, n INT NOT NULL)")
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.queues = {self.cfg["queue"]}

    def nodename(self, name: str) -> str:
        # unique per kit: two test processes' workers never share a pidbox queue
        return f"{name}.{self.prefix.strip(':')}@{socket.gethostname()}"

    def start(self, name: str, *queues: str, crasher: bool = False) -> None:
        """Start a worker (solo pool) on ``queues`` (default: the module's queue)."""
        env = {
            **os.environ,
            "ONCEONLY_CELERY": json.dumps(self.cfg),
            "ONCEONLY_CELERY_NAME": name,
        }
        if crasher:
            env["ONCEONLY_CELERY_CRASHER"] = "1"
        self.queues.update(queues)
        with (self.tmp / f"{name}.log").open("wb") as log:
            self.workers[name] = subprocess.Popen(
                [
                    *(sys.executable, "-m", "celery", "-A", "tests.contrib.celery_app", "worker"),
                    *("-P", "solo", "-n", self.nodename(name), "-l", "WARNING"),
                    *("-Q", ",".join(queues or (self.cfg["queue"],))),
                    *("--without-gossip", "--without-mingle", "--without-heartbeat"),
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self, *names: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        for name in names:
            while not self.redis.exists(f"{self.prefix}ready:{name}"):
                proc = self.workers[name]
                if proc.poll() is not None or time.monotonic() > deadline:
                    log = (self.tmp / f"{name}.log").read_text(errors="replace")
                    raise AssertionError(f"worker {name} did not start:\n{log[-3000:]}")
                time.sleep(0.05)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.workers.pop(name)
        if proc.poll() is None:
            proc.send_signal(sig)
        proc.wait(10)

    def crash(self, name: str, *args: object) -> tuple[str, str]:
        """Send ``name(*args)`` to a worker of its own (on a queue of its own) and
        SIGKILL that worker mid-task (the task waits for it after writing its marker
        file, named by its first argument). Returns the queue and the task id."""
        queue = f"{self.cfg['queue']}.{name}"
        task_id = str(uuid.uuid4())
        self.start("crasher", queue, crasher=True)
        self.wait_ready("crasher")
        self.app.send_task(name, args=list(args), task_id=task_id, queue=queue)
        marker = self.tmp / str(args[0])
        deadline = time.monotonic() + 15
        while not marker.exists():
            assert time.monotonic() < deadline, "the task never started"
            time.sleep(0.02)
        time.sleep(0.2)  # inside the task's sleep, past its writes
        self.kill("crasher")
        return queue, task_id

    def executions(self, task_id: str) -> list[tuple[str, str]]:
        """(worker, state) of every finished execution of ``task_id``, in order."""
        found = self.redis.lrange(f"{self.prefix}done:{task_id}", 0, -1)
        return [tuple(v.decode().split(":", 1)) for v in found]  # type: ignore[misc]

    def done(self, task_id: str) -> list[str]:
        """The workers that finished ``task_id`` successfully (runs and replays)."""
        return [name for name, state in self.executions(task_id) if state == "SUCCESS"]

    def wait_done(self, task_id: str, count: int, timeout: float = 15.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while len(found := self.done(task_id)) < count:
            assert time.monotonic() < deadline, f"{task_id}: {len(found)} of {count} executions"
            time.sleep(0.05)
        return found

    def rows(self, tag: str) -> int:
        with psycopg.connect(PG_URL) as conn:
            row = conn.execute(
                f"SELECT count(*) FROM {self.table}_biz WHERE tag = %s", (tag,)
            ).fetchone()
        assert row is not None
        return int(row[0])

    def record(self, scope: str, key: str) -> tuple[str, int]:
        with psycopg.connect(PG_URL) as conn:
            row = conn.execute(
                f"SELECT state, attempts FROM {self.table} WHERE scope = %s AND key = %s",
                (scope, key),
            ).fetchone()
        assert row is not None, f"no record for {scope}/{key}"
        return str(row[0]), int(row[1])

    def close(self) -> None:
        for name in list(self.workers):
            self.kill(name)
        with self.app.connection_for_write() as conn:
            for queue in self.queues:
                with contextlib.suppress(Exception):
                    conn.default_channel.queue_delete(queue)
        self.app.pool.force_close_all()  # this module's own pool (its own transport options)
        backend: Any = self.app.backend
        pubsub = getattr(backend.result_consumer, "_pubsub", None)
        if pubsub is not None:
            pubsub.close()
        backend.client.connection_pool.disconnect()
        self.store.close()
        for suffix in ("", "_outbox", "_biz"):
            drop_pg_table(f"{self.table}{suffix}")
        drop_redis_prefix(self.prefix)
        self.redis.close()
