"""An atomic ``@idempotent_task`` whose run kills its worker process ends dead.

With ``acks_late`` + ``task_reject_on_worker_lost`` (what brokers.md tells users to set),
a SIGKILLed prefork child requeues the task. The atomic run commits nothing, and Celery
keeps no delivery count: only the attempt counted before the run (in a write of its
own) counts the crash, so the task stops at ``max_attempts`` (``DeadLettered``) instead
of being redelivered for ever.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("celery")
kombu = pytest.importorskip("kombu")
import onceonly  # noqa: E402
from tests.conftest import PG_URL as PG  # noqa: E402

AMQP = os.environ.get("ONCEONLY_TEST_CELERY_AMQP", "amqp://guest:guest@127.0.0.1:5672//")
SRC = str(Path(__file__).resolve().parents[2] / "src")

TASKS = r"""
import os, signal
import onceonly
from celery import Celery
from onceonly.contrib.celery import idempotent_task

app = Celery("attack_poison", broker=os.environ["ATTACK_BROKER"])
app.conf.task_acks_late = True
app.conf.task_reject_on_worker_lost = True
app.conf.worker_prefetch_multiplier = 1
DB, T = os.environ["ATTACK_DB"], os.environ["ATTACK_T"]


def store():
    return onceonly.open_store(DB)


@app.task(bind=True)
@idempotent_task(store, atomic=True, max_attempts=1)
def killer(self, tx):
    with onceonly.open_store(DB).transaction() as s:  # a trace outside the task's tx
        s.execute(f"INSERT INTO {T} (pid) VALUES (?)", (os.getpid(),))
    os.kill(os.getpid(), signal.SIGKILL)
"""

MAX_ATTEMPTS = 1
BOUND = MAX_ATTEMPTS + 5  # what the broker consumers allow (max_deliveries default)


def test_atomic_task_that_kills_its_worker_is_not_run_for_ever(tmp_path):
    tag = uuid.uuid4().hex[:8]
    queue, table = f"attack-celery-{tag}", f"attack_celery_{tag}"
    store = onceonly.open_store(PG)
    store.migrate()
    with store.transaction() as s:
        s.execute(f"CREATE TABLE {table} (pid INTEGER)")
    (tmp_path / "attack_tasks.py").write_text(TASKS)
    env = dict(
        os.environ, PYTHONPATH=f"{tmp_path}:{SRC}", ATTACK_BROKER=AMQP, ATTACK_DB=PG, ATTACK_T=table
    )
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "attack_tasks",
            "worker",
            "--pool=prefork",
            "-c",
            "1",
            "-Q",
            queue,
            "-l",
            "warning",
        ],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    runs = 0
    settled = False
    try:
        sys.path.insert(0, str(tmp_path))
        os.environ.update(ATTACK_BROKER=AMQP, ATTACK_DB=PG, ATTACK_T=table)
        import attack_tasks

        attack_tasks.killer.apply_async((), queue=queue)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(1)
            with store.session() as s:
                runs = s.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            if runs > BOUND:
                break
            with kombu.Connection(AMQP) as c:
                _, ready, _ = c.default_channel.queue_declare(queue, passive=True)
            # settled: nothing ready and the worker is idle (the run count stopped moving)
            if ready == 0 and runs >= MAX_ATTEMPTS:
                time.sleep(8)
                with store.session() as s:
                    again = s.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                if again == runs:
                    settled = True
                    break
                runs = again
    finally:
        worker.terminate()
        worker.wait(30)
        log.close()
        for name in ("ATTACK_BROKER", "ATTACK_DB", "ATTACK_T"):
            os.environ.pop(name, None)
        sys.path.remove(str(tmp_path))
        sys.modules.pop("attack_tasks", None)
        with kombu.Connection(AMQP) as c:
            c.default_channel.queue_delete(queue)
        with store.transaction() as s:
            s.execute(f"DROP TABLE {table}")
        store.close()
    assert settled, f"the poison task ran {runs} times and is still being redelivered"
    assert runs == MAX_ATTEMPTS  # the crash was counted: dead after max_attempts runs
