# SPDX-License-Identifier: MIT
"""A bound on each round trip of the PostgreSQL store's own statements (``read_timeout``).

libpq has no read timeout: a server that stops answering (a stopped process, a half-open
connection behind a proxy) leaves a call waiting for ever, and TCP keepalives do not see
it, because the server's kernel still acknowledges. A watchdog thread per store shuts
down the socket of a connection whose round trip outlasts its bound; libpq then reports
the connection closed, and the store raises :class:`~onceonly.StoreUnavailable`, naming
the bound. Arming and disarming cost a dictionary write under an uncontended lock; the
thread wakes every :data:`TICK` seconds while the store is open.

Shared by the async store and its generated sync twin (a thread serves both: shutting a
socket down wakes an event loop's selector as it wakes a blocking wait).
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg

from onceonly.errors import StoreUnavailable

__all__ = ["TICK", "Watchdog"]

TICK = 0.2  # how late a bound may fire, at most


class _Armed:
    __slots__ = ("deadline", "fd", "fired")

    def __init__(self, deadline: float, fd: int) -> None:
        self.deadline = deadline
        self.fd = fd
        self.fired = False


class Watchdog:
    """Round-trip bounds of one store's connections (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._armed: dict[int, _Armed] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._closed = False

    @contextlib.contextmanager
    def bound(self, conn: Any, seconds: float | None) -> Iterator[None]:
        """Shut ``conn``'s socket down if the block has not ended within ``seconds``.

        Args:
            conn: a psycopg connection (sync or async).
            seconds: the bound; ``None`` or infinite: no bound.

        Raises:
            StoreUnavailable: the bound fired (the connection is closed).
        """
        if seconds is None or math.isinf(seconds) or self._closed:
            yield
            return
        try:
            fd = conn.pgconn.socket
        except psycopg.Error:  # closed already: the statement will say so
            yield
            return
        entry = _Armed(time.monotonic() + seconds, fd)
        self._start()
        with self._lock:
            self._armed[id(entry)] = entry
        try:
            yield
        except psycopg.Error as exc:
            if entry.fired:
                raise StoreUnavailable(
                    f"PostgreSQL did not answer within {seconds:g}s (read_timeout); the "
                    "connection was closed"
                ) from exc
            raise
        finally:
            with self._lock:
                self._armed.pop(id(entry), None)

    def close(self) -> None:
        """Stop the thread (at its next tick)."""
        self._closed = True

    def _start(self) -> None:
        if self._thread is not None and self._pid == os.getpid():
            return
        with self._lock:
            if self._thread is not None and self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._armed.clear()  # after a fork: the parent's round trips are not ours
            self._thread = threading.Thread(
                target=self._watch, name=f"onceonly-watchdog:{self._name}", daemon=True
            )
            self._thread.start()

    def _watch(self) -> None:
        while not self._closed:
            time.sleep(TICK)
            now = time.monotonic()
            with self._lock:  # disarming waits: the fd cannot be reused meanwhile
                for entry in self._armed.values():
                    if not entry.fired and entry.deadline <= now:
                        entry.fired = True
                        _shut(entry.fd)


def _shut(fd: int) -> None:
    """Shut the socket ``fd`` down (both ways) without closing the descriptor libpq owns."""
    with contextlib.suppress(OSError):
        dup = socket.socket(fileno=os.dup(fd))
        try:
            dup.shutdown(socket.SHUT_RDWR)
        finally:
            dup.close()
