# SPDX-License-Identifier: MIT
"""``idempotent_task``: a Celery task's effect once per task id (or key).

Put it under ``@app.task``. The key is the task id (``request.id``: the same for a
redelivery after a crash with ``acks_late``, for a task published twice with one id,
for Celery's own ``retry``) unless ``key=`` computes one from the task's arguments.
The scope of the keys is the task's name.

* **Atomic** (``atomic=True``, a SQL store): the function receives ``tx`` (after
  ``self`` for ``bind=True`` tasks) and runs inside :meth:`onceonly.Inbox.process`:
  the claim, its writes through ``tx`` and the completion commit together, so a worker
  killed mid-task leaves nothing behind and the redelivery runs on a clean slate. Each
  attempt is counted first in a write of its own (``precount_attempts``: one more round
  trip per run), so a task that kills its worker (``acks_late`` with
  ``task_reject_on_worker_lost`` redelivers it) still reaches ``max_attempts`` and ends
  dead (:class:`~onceonly.DeadLettered`) instead of being redelivered for ever.
* **Leased** (the default): the function runs under a leased claim
  (:class:`~onceonly.LeasedRunner`, as ``@idempotent``): for effects outside the
  database; works on every store, Redis included.

Either way a duplicate replays the stored result, a failure is recorded and counted
(``max_attempts`` failures make the key dead: :class:`~onceonly.DeadLettered`), and
the exception goes on to Celery, so ``autoretry_for`` works: the retry carries the same
task id and runs again, as the state machine allows a failed key. ``self.retry()`` (a
``celery.exceptions.Retry``) is not a failure: the run is rolled back (atomic) or its
claim released (leased) **without counting an attempt** (the inbox's and the runner's
public ``uncounted_errors``; a precounted attempt is given back too), so the task's own
``max_retries`` bounds the retries; when they run out, Celery raises the task's error,
and that failure is counted.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from celery import Task
from celery._state import get_current_task
from celery.exceptions import Retry

from onceonly._core import codec
from onceonly._core.durations import seconds
from onceonly._core.fingerprint import fingerprint
from onceonly._core.keys import validate_key
from onceonly._core.state import Policy
from onceonly.errors import ConfigurationError, InFlight
from onceonly.events import Listener
from onceonly.inbox import Inbox, LeasedRunner, Tx
from onceonly.messaging import Delivery
from onceonly.types import Store

__all__ = ["idempotent_task"]

F = TypeVar("F", bound=Callable[..., Any])

# The shortest countdown of a retry after InFlight, in seconds.
_MIN_COUNTDOWN = 0.05


def _without_tx(fn: Callable[..., Any]) -> inspect.Signature:
    """``fn``'s signature without its ``tx`` parameter (what Celery checks calls against)."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    at = 1 if params and params[0].name == "self" else 0
    if len(params) <= at:
        raise ConfigurationError(
            f"{fn.__qualname__} is atomic: it must take tx (after self for bind=True tasks)"
        )
    return sig.replace(parameters=params[:at] + params[at + 1 :])


def _delivery(task: Any, key: str) -> Delivery:
    request = task.request
    info = request.delivery_info or {}
    return Delivery(
        message_id=key,
        source=str(info.get("routing_key") or ""),
        redelivered=bool(info.get("redelivered")),
        headers={"task": task.name, "retries": request.retries or 0},
        raw=request,
    )


class _IdempotentTask:
    def __init__(
        self,
        store: Any,
        *,
        atomic: bool,
        key: Callable[..., str] | None,
        scope: str | None,
        ttl: float | None,
        lease: float,
        max_attempts: int,
        wait: float,
        cache_errors: tuple[type[BaseException], ...],
        max_result_bytes: int,
        listeners: tuple[Listener, ...],
        retry_in_flight: bool,
    ) -> None:
        if max_attempts < 1:
            raise ConfigurationError("max_attempts must be at least 1")
        if not callable(store):
            self._check(store, atomic)
        self.store = store
        self.atomic = atomic
        self.key = key
        self.scope = None if scope is None else validate_key(scope, what="scope")
        self.ttl = ttl
        self.lease = lease
        self.max_attempts = max_attempts
        self.wait = wait
        self.cache_errors = cache_errors
        self.max_result_bytes = codec.checked_max_bytes(max_result_bytes)
        self.listeners = listeners
        self.retry_in_flight = retry_in_flight
        self._runners: dict[str, Inbox | LeasedRunner] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _check(store: Store, atomic: bool) -> None:
        if atomic and not store.atomic:
            raise ConfigurationError(
                f"{type(store).__name__} cannot hold a transaction: use atomic=False"
            )
        if inspect.iscoroutinefunction(store.migrate):
            raise ConfigurationError("Celery tasks are sync: give a store from open_store()")

    def _runner(self, scope: str) -> Inbox | LeasedRunner:
        with self._lock:
            runner = self._runners.get(scope)
            if runner is None:
                if callable(self.store):  # opened in the worker process, at first use
                    self.store = self.store()
                    self._check(self.store, self.atomic)
                if self.atomic:
                    # Each attempt is precounted: a worker killed inside the task commits
                    # nothing, and Celery keeps no delivery count, so only the mark written
                    # before the run counts the crash toward max_attempts. A Retry is no
                    # failure: rolled back uncounted, its precount mark given back.
                    runner = Inbox(
                        self.store,
                        scope,
                        ttl=self.ttl,
                        max_attempts=self.max_attempts,
                        wait=self.wait,
                        stale_after=self.lease,
                        cache_errors=self.cache_errors,
                        uncounted_errors=(Retry,),
                        max_result_bytes=self.max_result_bytes,
                        listeners=self.listeners,
                        precount_attempts=True,
                    )
                else:
                    runner = LeasedRunner(
                        self.store,
                        scope=scope,
                        policy=Policy(self.lease, self.max_attempts),
                        ttl=self.ttl,
                        wait=self.wait,
                        cache_errors=self.cache_errors,
                        uncounted_errors=(Retry,),
                        max_result_bytes=self.max_result_bytes,
                        listeners=self.listeners,
                    )
                self._runners[scope] = runner
            return runner

    def __call__(self, fn: F) -> F:
        if inspect.iscoroutinefunction(fn):
            raise ConfigurationError(f"{fn.__qualname__} is async: Celery runs sync tasks")
        # what Celery checks calls against (it does not follow __wrapped__)
        signature = _without_tx(fn) if self.atomic else inspect.signature(fn)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            bound = bool(args) and isinstance(args[0], Task)
            task = args[0] if bound else get_current_task()
            call_args = args[1:] if bound else args
            if task is None:
                raise ConfigurationError(f"{fn.__qualname__} must run as a Celery task")
            if self.key is not None:
                key = validate_key(self.key(*call_args, **kwargs))
            elif task.request.id:
                key = validate_key(task.request.id)
            else:
                raise ConfigurationError(
                    f"{task.name} was called without a task id (a direct call): give "
                    "idempotent_task(key=...) or call it through the broker"
                )
            scope = self.scope or validate_key(task.name, what="scope")
            payload = {"args": list(call_args), "kwargs": kwargs}
            runner = self._runner(scope)
            try:
                if isinstance(runner, Inbox):
                    head = args[:1] if bound else ()

                    def handler(_: Any, tx: Tx) -> Any:
                        return fn(*head, tx, *call_args, **kwargs)

                    delivery = _delivery(task, key)
                    return runner.process(key, payload, handler, delivery=delivery).result

                def leased() -> Any:
                    return fn(*args, **kwargs)

                result, _, _ = runner.run(key, fingerprint(payload), leased, payload)
            except InFlight as exc:
                if not self.retry_in_flight:
                    raise
                # Another worker runs this key: come back when its lease could lapse (a
                # crashed holder is then taken over), or after `wait` if that is unknown.
                countdown = max(exc.retry_after or self.wait, _MIN_COUNTDOWN)
                raise task.retry(exc=exc, countdown=countdown) from exc
            return result

        run.__signature__ = signature  # type: ignore[attr-defined]
        return run  # type: ignore[return-value]


def idempotent_task(
    store: Any,
    *,
    atomic: bool = False,
    key: Callable[..., str] | None = None,
    scope: str | None = None,
    ttl: dt.timedelta | float | None = dt.timedelta(days=7),
    lease: dt.timedelta | float = dt.timedelta(seconds=30),
    max_attempts: int = 5,
    wait: dt.timedelta | float = 5.0,
    cache_errors: tuple[type[BaseException], ...] = (),
    max_result_bytes: int = codec.DEFAULT_MAX_BYTES,
    listeners: Iterable[Listener] = (),
    retry_in_flight: bool = True,
) -> Callable[[F], F]:
    """Make a Celery task run its effect once per task id (or key); put it under
    ``@app.task``.

    Args:
        store: a sync store (:func:`onceonly.open_store`), or a function returning one,
            called at the first task run: a store opened in the worker process, not in
            a parent that forks (Celery's prefork pool).
        atomic: run in atomic mode: the function takes ``tx`` (after ``self`` for
            ``bind=True``) and its writes through ``tx`` commit with the claim. Needs a
            SQL store, the same database the task writes to.
        key: computes the key from the task's arguments (without ``self``); default:
            the task id.
        scope: the namespace of the keys (default: the task's name).
        ttl: how long a completed task is replayed (``None``: for ever).
        lease: leased mode: how long a claim lives without renewal (renewed while the
            task runs); atomic mode: the claim's safety-net lease.
        max_attempts: failures after which the key is dead (``DeadLettered``).
        wait: how long a duplicate waits for a running copy before ``InFlight``.
        cache_errors: exception classes stored and re-raised to duplicates.
        max_result_bytes: the largest encoded result stored.
        listeners: callables handed an :class:`~onceonly.events.Event` per run.
        retry_in_flight: when another worker holds the key (:class:`~onceonly.InFlight`
            after ``wait``), retry through Celery's ``retry`` once the holder's lease
            could lapse (so a crashed holder is taken over, and a live one's result is
            replayed); ``False``: raise ``InFlight``. Each such retry counts against
            the task's ``max_retries``, not against ``max_attempts``.

    Returns:
        A decorator; Celery sees the function's signature without ``tx``.

    Raises:
        ConfigurationError: ``atomic=True`` with a store that cannot hold a transaction,
            an async store, or an atomic function without a ``tx`` parameter.

    .. versionadded:: 0.3
    """
    return _IdempotentTask(
        store,
        atomic=atomic,
        key=key,
        scope=scope,
        ttl=None if ttl is None else seconds(ttl, what="ttl"),
        lease=seconds(lease, what="lease"),
        max_attempts=max_attempts,
        wait=seconds(wait, what="wait", allow_inf=True, allow_zero=True),
        cache_errors=cache_errors,
        max_result_bytes=max_result_bytes,
        listeners=tuple(listeners),
        retry_in_flight=retry_in_flight,
    )
