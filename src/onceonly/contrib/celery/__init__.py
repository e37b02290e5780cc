# SPDX-License-Identifier: MIT
"""Celery: idempotent tasks and outbox-backed enqueue (``pip install 'onceonly[celery]'``).

* :func:`idempotent_task` wraps a task's function so a redelivered or duplicated task
  (``acks_late`` and a worker crash, the same task id published twice) runs its effect
  once and replays its stored result. Keyed by the task id, or by a key function.
* :func:`enqueue` writes the task into the outbox in the business transaction;
  :class:`CeleryPublisher` (or :class:`AsyncCeleryPublisher`) lets a relay send it to
  Celery's broker with the outbox row's id as the task id. This replaces
  ``transaction.on_commit(lambda: task.delay(...))``, which loses the task when the
  process dies between the commit and the send.

.. versionadded:: 0.3
"""

from __future__ import annotations

try:
    import celery as _celery  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "onceonly.contrib.celery needs Celery: pip install 'onceonly[celery]'"
    ) from exc

from onceonly.contrib.celery._enqueue import (
    AsyncCeleryPublisher,
    CeleryPublisher,
    enqueue,
    task_call,
)
from onceonly.contrib.celery._task import idempotent_task

__all__ = [
    "AsyncCeleryPublisher",
    "CeleryPublisher",
    "enqueue",
    "idempotent_task",
    "task_call",
]
