# SPDX-License-Identifier: MIT
"""Idempotent Celery tasks and outbox-backed enqueue, on a real worker over Redis.

One worker process (solo pool, ``acks_late``) on this module's own queue, every kombu
key under this module's prefix (``global_keyprefix``). The enqueue goes through the
async path here (AsyncInbox, AsyncRelay, AsyncCeleryPublisher).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import onceonly
from onceonly.contrib.celery import AsyncCeleryPublisher, enqueue
from tests.conftest import PG_URL, REDIS_URL, require_postgres, require_redis
from tests.contrib._celery_kit import Kit
from tests.contrib.celery_app import VISIBILITY_TIMEOUT


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    require_postgres()
    require_redis()
    kit = Kit(REDIS_URL, Path(tmp_path_factory.mktemp("celery-redis")))
    try:
        kit.start("r1")
        kit.wait_ready("r1")
        yield kit
    finally:
        kit.close()


async def test_async_enqueue_relay_and_a_resend_run_once(kit: Kit) -> None:
    """await enqueue(tx, ...) in an AsyncInbox handler; an AsyncRelay sends it; a resend
    of the same row (the relay crashed before its delete) is replayed."""
    tag = uuid.uuid4().hex
    store = onceonly.open_async_store(PG_URL, table=kit.table, outbox_table=f"{kit.table}_outbox")
    try:
        inbox = onceonly.AsyncInbox(store, consumer="orders")

        async def place(order: dict[str, str], tx: onceonly.AsyncTx) -> str:
            signature = kit.app.signature("t.record", args=[order["tag"]]).set(
                queue=kit.cfg["queue"]
            )
            return await enqueue(tx, signature, n=3)

        task_id = (await inbox.process(tag, {"tag": tag}, place)).result
        [row] = await onceonly.AsyncOutbox(store).rows("pending")
        publisher = AsyncCeleryPublisher(kit.app)
        relay = onceonly.AsyncRelay(store, publisher, listen=False)
        assert (await relay.run_once()).published == 1
        await publisher.publish(row.message)  # the same row sent again
    finally:
        await store.close()
    kit.wait_done(task_id, 2)
    assert kit.app.AsyncResult(task_id).get(timeout=10) == {"tag": tag, "n": 3, "attempt": 1}
    assert kit.rows(tag) == 1


def test_leased_task_on_the_redis_store_runs_once_per_task_id(kit: Kit) -> None:
    """Leased mode (Redis store): the same task id delivered twice runs its effect once."""
    tag, task_id = uuid.uuid4().hex, str(uuid.uuid4())
    for _ in range(2):
        kit.app.send_task("t.effect", args=[tag], task_id=task_id)
    kit.wait_done(task_id, 2)
    assert kit.app.AsyncResult(task_id).get(timeout=5) == 1
    assert int(kit.redis.get(f"{kit.prefix}runs:{tag}") or 0) == 1
    other = str(uuid.uuid4())  # another task id is another key: it runs
    kit.app.send_task("t.effect", args=[tag], task_id=other)
    assert kit.app.AsyncResult(other).get(timeout=10) == 2


def test_sigkill_mid_task_with_acks_late_is_restored_and_commits_once(kit: Kit) -> None:
    """Redis: the unacknowledged task comes back after the visibility timeout; atomic
    mode left nothing of the killed run, and the redelivery writes the row once."""
    tag = uuid.uuid4().hex
    queue, task_id = kit.crash("t.crashy", tag)
    assert kit.rows(tag) == 0
    time.sleep(VISIBILITY_TIMEOUT)  # kombu restores messages unacknowledged this long
    kit.start("r2", queue)
    result = kit.app.AsyncResult(task_id).get(timeout=20)
    assert result == {"redelivered": True, "attempt": 2}  # kombu flags a restored task
    assert kit.rows(tag) == 1
    assert kit.done(task_id) == ["r2"]
