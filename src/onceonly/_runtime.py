# SPDX-License-Identifier: MIT
"""The runtime the layers share: paired sync/async primitives, fencing tokens, jitter.

``tools/unasync.py`` rewrites ``asleep`` to ``sleep`` and ``AsyncHeartbeat`` to
``Heartbeat``, so async sources and their sync twins call matching names here.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import heapq
import itertools
import logging
import os
import secrets
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from onceonly.errors import StoreError, StoreUnavailable

log = logging.getLogger("onceonly.lease")

T = TypeVar("T")

monotonic = time.monotonic


def sleep(seconds: float) -> None:
    time.sleep(seconds)


async def asleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


def within(fn: Callable[[], T], timeout: float | None) -> T:
    """``fn()``, abandoned after ``timeout`` seconds (``None``: no bound).

    A bounded call runs in a worker thread: a blocking driver call (a pool waiting for a
    connection) cannot be interrupted, so the caller stops waiting for it instead. An
    abandoned call finishes on its own; only idempotent calls (fenced writes) may be
    bounded this way.

    Raises:
        TimeoutError: ``fn`` did not return within ``timeout``.
    """
    if timeout is None:
        return fn()
    future = _bounded_pool().submit(fn)
    try:
        return future.result(timeout=max(timeout, 0.0))
    except concurrent.futures.TimeoutError:
        raise TimeoutError(f"no answer within {timeout:.1f} s") from None


async def within_async(fn: Callable[[], Awaitable[T]], timeout: float | None) -> T:
    """``await fn()``, abandoned after ``timeout`` seconds (``None``: no bound).

    The call runs in a task that is cancelled at the bound, and not waited for: a driver
    may take long to handle its cancellation (a cancel request to a server that does
    not answer). Only idempotent calls (fenced writes) may be bounded this way.

    Raises:
        TimeoutError: ``fn`` did not return within ``timeout``.
    """
    if timeout is None:
        return await fn()

    async def call() -> T:
        return await fn()

    task = asyncio.ensure_future(call())
    done, _ = await asyncio.wait({task}, timeout=max(timeout, 0.0))
    if task in done:
        return task.result()
    task.cancel()
    _abandoned.add(task)
    task.add_done_callback(_abandoned.discard)
    task.add_done_callback(_retrieve)
    raise TimeoutError(f"no answer within {timeout:.1f} s")


_abandoned: set[asyncio.Future[Any]] = set()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned task's outcome, so it is never reported as lost."""
    if not task.cancelled():
        task.exception()


_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def _bounded_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = concurrent.futures.ThreadPoolExecutor(32, "onceonly-bounded")
            _pool_pid = os.getpid()
        return _pool


def gather(thunks: list[Callable[[], None]], limit: int) -> None:
    """Run ``thunks`` one after the other (the sync twin of :func:`agather`)."""
    for thunk in thunks:
        thunk()


async def agather(thunks: list[Callable[[], Awaitable[None]]], limit: int) -> None:
    """Run ``thunks`` concurrently, at most ``limit`` at a time."""
    semaphore = asyncio.Semaphore(limit)

    async def run(thunk: Callable[[], Awaitable[None]]) -> None:
        async with semaphore:
            await thunk()

    await asyncio.gather(*(run(t) for t in thunks))


class _Renewals:
    """One daemon thread per process that runs every sync heartbeat when it is due.

    Starting a thread per call cost more than the claim itself; the scheduler keeps a
    heap of due times instead. It is created on first use and again after a fork.
    """

    _instance: _Renewals | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Heartbeat]] = []
        self._seq = itertools.count()
        threading.Thread(target=self._run, name="onceonly-renewals", daemon=True).start()

    @classmethod
    def get(cls) -> _Renewals:
        with cls._instance_lock:
            if cls._instance is None or cls._instance.pid != os.getpid():
                cls._instance = cls()
            return cls._instance

    def schedule(self, hb: Heartbeat, due: float) -> None:
        with self._cond:
            heapq.heappush(self._heap, (due, next(self._seq), hb))
            # Wake the thread only when its next wake-up moves earlier: waking it for
            # every call (most heartbeats are due after the one it waits for) costs a
            # thread switch per call.
            if self._heap[0][2] is hb:
                self._cond.notify()

    def _run(self) -> None:
        heap = self._heap
        while True:
            with self._cond:
                while True:
                    # Most heartbeats stop long before they are due (the call ended):
                    # drop them here instead of waking up for each one.
                    while heap and heap[0][2].stopped:
                        heapq.heappop(heap)
                    if heap and heap[0][0] <= time.monotonic():
                        break
                    self._cond.wait(heap[0][0] - time.monotonic() if heap else None)
                _, _, hb = heapq.heappop(heap)
            if hb.beat_once():
                self.schedule(hb, time.monotonic() + hb.interval)

    def pending(self) -> list[Heartbeat]:
        """The heartbeats in the heap (stopped ones not yet dropped too); for tests."""
        with self._cond:
            return [hb for _, _, hb in self._heap]


class Heartbeat:
    """Calls ``beat()`` every ``interval`` seconds (on a shared thread) until stopped.

    ``beat`` returns False when the claim is gone; the heartbeat then stops. After
    :meth:`stop` returns, ``beat`` is not running and will not run again.
    """

    __slots__ = ("_beat", "_lock", "interval")

    def __init__(self, interval: float, beat: Callable[[], bool]) -> None:
        self.interval = interval
        self._beat: Callable[[], bool] | None = beat  # None once stopped
        self._lock = threading.Lock()  # held while a beat runs

    @property
    def stopped(self) -> bool:
        return self._beat is None

    def beat_once(self) -> bool:
        """Run one beat; whether to schedule the next."""
        with self._lock:
            beat = self._beat
            if beat is None:
                return False
            try:
                if not beat():
                    return False
            except Exception as exc:
                return _renewal_failed(exc)
            return True

    def start(self) -> None:
        _Renewals.get().schedule(self, time.monotonic() + self.interval)

    def stop(self) -> None:
        with self._lock:
            # Drop the beat (and the claim it holds): a stopped heartbeat waits in the
            # scheduler's heap until it is due, and should weigh nothing meanwhile.
            self._beat = None


def _renewal_failed(exc: Exception) -> bool:
    """Log a renewal that raised; whether to beat again. A store outage is retried at
    the next beat; a store error no retry can cure (a closed store, a missing table)
    stops the heartbeat: the lease then lapses and the fenced final write tells."""
    if isinstance(exc, StoreError) and not isinstance(exc, StoreUnavailable):
        log.warning("lease renewal failed for good (%s); the heartbeat stops", exc)
        return False
    log.warning("lease renewal failed; retrying", exc_info=True)
    return True


class AsyncHeartbeat:
    """Awaits ``beat()`` every ``interval`` seconds in a task until stopped."""

    def __init__(self, interval: float, beat: Callable[[], Awaitable[bool]]) -> None:
        self.interval = interval
        self._beat = beat
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                if not await self._beat():
                    return
            except Exception as exc:
                if not _renewal_failed(exc):
                    return

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def random_fraction() -> float:
    """A number in ``[0, 1)`` for backoff jitter (not for security)."""
    return secrets.randbits(53) / (1 << 53)


# Fencing tokens are drawn from the OS's CSPRNG in bulk (one getrandom call per
# _TOKEN_BATCH tokens, not one per token). A deque's popleft is atomic, so threads never
# share a token; a forked child drops the buffer it inherited, or parent and child would
# hand out the same tokens.
_TOKEN_BATCH = 256
_TOKEN_MASK = (1 << 63) - 1
_token_buffer: collections.deque[int] = collections.deque()
_unpack_tokens = struct.Struct(f"<{_TOKEN_BATCH}Q").unpack


def _drop_tokens() -> None:
    _token_buffer.clear()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_drop_tokens)


def new_token() -> int:
    """A fresh fencing token: 63 random bits, so a token is never reused for a key,
    even after its record was purged and claimed again.

    The bits come from ``os.urandom`` (as ``secrets`` does), read in bulk; every token
    is handed out once per process.
    """
    try:
        token = _token_buffer.popleft()
    except IndexError:
        _token_buffer.extend(v & _TOKEN_MASK for v in _unpack_tokens(os.urandom(8 * _TOKEN_BATCH)))
        return new_token()
    return token or 1
