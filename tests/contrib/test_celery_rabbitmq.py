# SPDX-License-Identifier: MIT
"""Idempotent Celery tasks and outbox-backed enqueue, on real workers over RabbitMQ.

Two worker processes (solo pool, ``acks_late``) share this module's own queue; the
crash test adds a third on a queue of its own and SIGKILLs it mid-task. Tasks are in
tests/contrib/celery_app.py; the store and the business table are on PostgreSQL.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import onceonly
from onceonly.contrib.celery import CeleryPublisher, enqueue
from tests.conftest import require_postgres, require_redis, unavailable
from tests.contrib._celery_kit import Kit

CELERY_AMQP = os.environ.get("ONCEONLY_TEST_CELERY_AMQP", "amqp://guest:guest@127.0.0.1:5672//")


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    require_postgres()
    require_redis()
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=2).close()
    except OSError:
        unavailable("RabbitMQ at 127.0.0.1:5672")
    kit = Kit(CELERY_AMQP, Path(tmp_path_factory.mktemp("celery-amqp")))
    try:
        kit.start("w1")
        kit.start("w2")
        kit.wait_ready("w1", "w2")
        yield kit
    finally:
        kit.close()


def _send(kit: Kit, name: str, *args: object, task_id: str) -> None:
    kit.app.send_task(name, args=list(args), task_id=task_id)


def test_outbox_enqueue_relay_and_a_resend_run_once(kit: Kit) -> None:
    """enqueue() in the business transaction, a relay sends it; a resend replays."""
    tag = uuid.uuid4().hex
    inbox = onceonly.Inbox(kit.store, consumer="orders")

    def place(order: dict[str, str], tx: onceonly.Tx) -> str:
        return enqueue(tx, kit.app.tasks["t.record"], order["tag"], n=7)

    task_id = inbox.process(tag, {"tag": tag}, place).result
    publisher = CeleryPublisher(kit.app)
    outbox = onceonly.Outbox(kit.store)
    [row] = outbox.rows("pending")
    assert row.message.id == task_id and row.message.topic == "celery:t.record"
    assert onceonly.Relay(kit.store, publisher).run_once().published == 1
    result = kit.app.AsyncResult(task_id).get(timeout=15)
    assert result == {"tag": tag, "n": 7, "attempt": 1}
    # the relay died between the broker's acceptance and its delete: the row goes again
    publisher.publish(row.message)
    assert len(kit.wait_done(task_id, 2)) == 2
    assert kit.rows(tag) == 1
    assert kit.record("t.record", task_id) == ("completed", 0)


def test_the_same_task_id_twice_runs_once_on_two_workers_at_once(kit: Kit) -> None:
    """Two workers take the same task id concurrently: one runs, the other replays."""
    tag, task_id = uuid.uuid4().hex, str(uuid.uuid4())
    _send(kit, "t.slow", tag, task_id=task_id)
    _send(kit, "t.slow", tag, task_id=task_id)
    workers = kit.wait_done(task_id, 2)
    assert sorted(workers) == ["w1", "w2"]  # both ran it at the same time (1 s each)
    assert kit.rows(tag) == 1
    assert kit.app.AsyncResult(task_id).get(timeout=5) == tag


def test_celery_retry_runs_it_again_without_counting_an_attempt(kit: Kit) -> None:
    """bind=True with a key function: self.retry() twice, then success; 3 runs, 1 result,
    no failed attempt recorded (a Retry is not a failure)."""
    tag, task_id = uuid.uuid4().hex, str(uuid.uuid4())
    _send(kit, "t.flaky", tag, 2, task_id=task_id)
    result = kit.app.AsyncResult(task_id).get(timeout=15)
    assert result == {"runs": 3, "retries": 2}
    assert kit.record("t.flaky", f"flaky:{tag}") == ("completed", 0)
    # the same call under another task id is the same key: replayed, not run
    again = str(uuid.uuid4())
    _send(kit, "t.flaky", tag, 2, task_id=again)
    assert kit.app.AsyncResult(again).get(timeout=15) == {"runs": 3, "retries": 2}
    assert int(kit.redis.get(f"{kit.prefix}runs:{tag}") or 0) == 3


@pytest.mark.parametrize("name", ["t.patient", "t.patient_atomic"])
def test_max_retries_10_outlives_max_attempts_5(kit: Kit, name: str) -> None:
    """max_retries=10, seven self.retry() calls: the task's own max_retries governs, the
    8th run succeeds (max_attempts=5 is not consumed by retries)."""
    tag, task_id = uuid.uuid4().hex, str(uuid.uuid4())
    _send(kit, name, tag, 7, task_id=task_id)
    result = kit.app.AsyncResult(task_id).get(timeout=30)
    assert result["runs"] == 8 and result["retries"] == 7
    key = f"patient:{tag}" if name == "t.patient" else task_id
    assert kit.record(name, key) == ("completed", 0)
    if name == "t.patient_atomic":
        assert kit.rows(tag) == 1  # the retried runs' writes rolled back
        assert result["attempt"] == 1


def test_retries_running_out_is_one_counted_failure(kit: Kit) -> None:
    """self.retry(exc=...) past max_retries raises exc: that failure is counted (once)."""
    tag, task_id = uuid.uuid4().hex, str(uuid.uuid4())
    _send(kit, "t.flaky", tag, 99, task_id=task_id)  # max_retries=5: 6 runs
    with pytest.raises(RuntimeError, match="boom 6"):
        kit.app.AsyncResult(task_id).get(timeout=20)
    assert kit.record("t.flaky", f"flaky:{tag}") == ("failed", 1)
    assert int(kit.redis.get(f"{kit.prefix}runs:{tag}") or 0) == 6


def _crash_and_redeliver_to_w1(
    kit: Kit, name: str, *args: object, killed: Callable[[], None] = lambda: None
) -> tuple[str, object]:
    """SIGKILL a worker mid-task, let w1 take its queue over (RabbitMQ redelivers the
    unacknowledged task at once); the task id and its result. ``killed`` runs between
    the kill and the redelivery."""
    queue, task_id = kit.crash(name, *args)
    killed()
    reply = kit.app.control.add_consumer(
        queue, destination=[kit.nodename("w1")], reply=True, timeout=5
    )
    assert reply, "w1 did not answer"
    try:
        return task_id, kit.app.AsyncResult(task_id).get(timeout=20)
    finally:
        kit.app.control.cancel_consumer(queue, destination=[kit.nodename("w1")], reply=True)


def test_sigkill_mid_task_with_acks_late_redelivers_and_commits_once(kit: Kit) -> None:
    """Atomic mode: the killed run committed nothing but its precounted attempt; the
    redelivery writes the row once, as attempt 2."""
    tag = uuid.uuid4().hex

    def nothing_committed() -> None:
        assert kit.rows(tag) == 0

    task_id, result = _crash_and_redeliver_to_w1(kit, "t.crashy", tag, killed=nothing_committed)
    assert result == {"redelivered": True, "attempt": 2}  # the killed run was counted
    assert kit.rows(tag) == 1
    assert kit.done(task_id) == ["w1"]


def test_sigkill_mid_leased_task_is_taken_over_when_its_lease_lapses(kit: Kit) -> None:
    """Leased mode: the redelivery finds a live claim (InFlight), retries through Celery
    until the dead worker's lease lapses, then takes the key over: the task is not lost
    (the killed run's outside effect may have happened: leased mode runs it again)."""
    tag = uuid.uuid4().hex
    task_id, result = _crash_and_redeliver_to_w1(kit, "t.leased", tag, 0.0)
    assert result == {"runs": 2, "attempt": 2}
    assert ("w1", "RETRY") in kit.executions(task_id)


def test_a_duplicate_of_a_running_leased_task_retries_then_replays(kit: Kit) -> None:
    """InFlight becomes a Celery retry; the retry replays the first run's result."""
    tag, task_id = uuid.uuid4().hex, str(uuid.uuid4())
    _send(kit, "t.leased", tag, 1.5, task_id=task_id)
    _send(kit, "t.leased", tag, 1.5, task_id=task_id)
    kit.wait_done(task_id, 2)
    states = [state for _, state in kit.executions(task_id)]
    assert states.count("RETRY") >= 1 and states.count("SUCCESS") == 2
    assert int(kit.redis.get(f"{kit.prefix}runs:{tag}") or 0) == 1
    assert kit.app.AsyncResult(task_id).get(timeout=5) == {"runs": 1, "attempt": 1}
