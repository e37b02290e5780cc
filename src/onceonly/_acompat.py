# SPDX-License-Identifier: MIT
"""Paired sync/async primitives used by the generated sync twins.

``tools/unasync.py`` rewrites ``asleep`` to ``sleep`` and ``AsyncHeartbeat`` to
``Heartbeat``, so async sources and their sync twins call matching names here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("onceonly.lease")

monotonic = time.monotonic


def sleep(seconds: float) -> None:
    time.sleep(seconds)


async def asleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


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


class Heartbeat:
    """Calls ``beat()`` every ``interval`` seconds in a daemon thread until stopped.

    ``beat`` returns False when the claim is gone; the heartbeat then stops and
    ``lost`` becomes true.
    """

    def __init__(self, interval: float, beat: Callable[[], bool]) -> None:
        self.interval = interval
        self._beat = beat
        self._stop = threading.Event()
        self.lost = False
        self._thread = threading.Thread(target=self._run, name="onceonly-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if not self._beat():
                    self.lost = True
                    return
            except Exception:  # a failed renewal is retried at the next beat
                log.warning("lease renewal failed; retrying", exc_info=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


class AsyncHeartbeat:
    """Awaits ``beat()`` every ``interval`` seconds in a task until stopped."""

    def __init__(self, interval: float, beat: Callable[[], Awaitable[bool]]) -> None:
        self.interval = interval
        self._beat = beat
        self.lost = False
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                if not await self._beat():
                    self.lost = True
                    return
            except Exception:
                log.warning("lease renewal failed; retrying", exc_info=True)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
