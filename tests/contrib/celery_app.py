# SPDX-License-Identifier: MIT
"""The Celery app the tests run real workers on (``celery -A tests.contrib.celery_app``).

Its configuration is one JSON object in ``ONCEONLY_CELERY`` (the worker's environment);
the test process builds the same app with :func:`build`. Every run of a task body
writes a row to the business table (atomic tasks: in the claim's transaction) or counts
in Redis (leased tasks); every task execution the worker finishes (a run or a replay)
is pushed to ``<prefix>done:<task id>`` as ``<worker>:<state>`` (SUCCESS, RETRY, …).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import redis
from celery import Celery, signals

import onceonly
from onceonly.contrib.celery import idempotent_task

VISIBILITY_TIMEOUT = 2.0


def build(cfg: dict[str, Any]) -> Celery:
    app = Celery("onceonly_test", broker=cfg["broker"], backend=cfg["backend"])
    prefix = cfg["prefix"]
    options: dict[str, Any] = {"confirm_publish": True}
    if cfg["broker"].startswith("redis"):
        # an unacknowledged task is redelivered 2 s after its delivery (tasks here are
        # short; the crash test waits that long)
        options = {"global_keyprefix": prefix, "visibility_timeout": VISIBILITY_TIMEOUT}
    app.conf.update(
        task_default_queue=cfg["queue"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options=options,
        broker_connection_retry_on_startup=True,
        result_expires=600,
        worker_hijack_root_logger=False,
    )
    table, biz = cfg["table"], f"{cfg['table']}_biz"
    r = redis.Redis.from_url(cfg["redis"])

    def store() -> Any:
        return onceonly.open_store(cfg["pg"], table=table, outbox_table=f"{table}_outbox")

    @app.task(name="t.record", shared=False)
    @idempotent_task(store, atomic=True)
    def record(tx: Any, tag: str, n: int = 1) -> dict[str, Any]:
        tx.execute(f"INSERT INTO {biz} (tag, n) VALUES (?, ?)", (tag, n))
        return {"tag": tag, "n": n, "attempt": tx.attempt}

    @app.task(name="t.slow", shared=False)
    @idempotent_task(store, atomic=True, wait=30)
    def slow(tx: Any, tag: str) -> str:
        tx.execute(f"INSERT INTO {biz} (tag, n) VALUES (?, ?)", (tag, 1))
        time.sleep(1.0)
        return tag

    @app.task(name="t.crashy", shared=False)
    @idempotent_task(store, atomic=True)
    def crashy(tx: Any, tag: str) -> dict[str, Any]:
        tx.execute(f"INSERT INTO {biz} (tag, n) VALUES (?, ?)", (tag, 1))
        marker = Path(cfg["markers"]) / tag
        if os.environ.get("ONCEONLY_CELERY_CRASHER") and not marker.exists():
            marker.write_text("running")
            time.sleep(60)  # the test SIGKILLs the worker here
        return {"redelivered": tx.delivery.redelivered, "attempt": tx.attempt}

    @app.task(name="t.flaky", shared=False, bind=True, max_retries=5)
    @idempotent_task(store, key=lambda tag, fails: f"flaky:{tag}")
    def flaky(self: Any, tag: str, fails: int) -> dict[str, Any]:
        n = int(r.incr(f"{prefix}runs:{tag}"))
        if n <= fails:
            raise self.retry(countdown=0.1, exc=RuntimeError(f"boom {n}"))
        return {"runs": n, "retries": self.request.retries}

    @app.task(name="t.patient", shared=False, bind=True, max_retries=10)
    @idempotent_task(store, key=lambda tag, fails: f"patient:{tag}")
    def patient(self: Any, tag: str, fails: int) -> dict[str, Any]:
        n = int(r.incr(f"{prefix}runs:{tag}"))
        if n <= fails:
            raise self.retry(countdown=0.05)
        return {"runs": n, "retries": self.request.retries}

    @app.task(name="t.patient_atomic", shared=False, bind=True, max_retries=10)
    @idempotent_task(store, atomic=True)
    def patient_atomic(self: Any, tx: Any, tag: str, fails: int) -> dict[str, Any]:
        tx.execute(f"INSERT INTO {biz} (tag, n) VALUES (?, ?)", (tag, 1))
        n = int(r.incr(f"{prefix}runs:{tag}"))
        if n <= fails:
            raise self.retry(countdown=0.05)
        return {"runs": n, "retries": self.request.retries, "attempt": tx.attempt}

    @app.task(name="t.leased", shared=False, max_retries=10)
    # a lease long enough that the killed worker's claim is still live when the task is
    # redelivered, even on a loaded machine (the InFlight → Celery retry path)
    @idempotent_task(store, lease=3.0, wait=0.2)
    def leased(tag: str, seconds: float) -> dict[str, Any]:
        n = int(r.incr(f"{prefix}runs:{tag}"))
        marker = Path(cfg["markers"]) / tag
        if os.environ.get("ONCEONLY_CELERY_CRASHER") and not marker.exists():
            marker.write_text("running")
            time.sleep(60)  # the test SIGKILLs the worker here
        time.sleep(seconds)
        return {"runs": n, "attempt": onceonly.current_claim().attempt}

    @app.task(name="t.effect", shared=False)
    @idempotent_task(onceonly.open_store(cfg["redis"], prefix=f"{prefix}rec:"))
    def effect(tag: str) -> int:
        return int(r.incr(f"{prefix}runs:{tag}"))

    @signals.task_postrun.connect(weak=False)
    def done(task_id: str | None = None, state: str | None = None, **_: Any) -> None:
        name = os.environ.get("ONCEONLY_CELERY_NAME", "?")
        r.rpush(f"{prefix}done:{task_id}", f"{name}:{state}")

    @signals.worker_ready.connect(weak=False)
    def ready(**_: Any) -> None:
        r.set(f"{prefix}ready:{os.environ.get('ONCEONLY_CELERY_NAME', '?')}", "1", ex=600)

    return app


if "ONCEONLY_CELERY" in os.environ:
    app = build(json.loads(os.environ["ONCEONLY_CELERY"]))
