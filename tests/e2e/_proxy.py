# SPDX-License-Identifier: MIT
"""A TCP proxy in a thread of the test, whose connections can all be dropped at once.

``drop()`` resets every open connection on both sides (the client sees a reset, the
broker a vanished peer) while the listening socket stays open, so clients can reconnect
through it, as they would to a broker that came back.

``arm(lose)`` drops them in the middle of a request instead: on the next bytes a client
sends (a publish, an ack), the network goes half dark for ``blackout`` seconds and then
every connection is reset. ``lose="replies"`` lets that request (and any other the
clients send meanwhile) reach the broker but none of its answers come back: a publish
the broker stored whose confirmation is lost. ``lose="requests"`` lets nothing more
from the clients through: an acknowledgement the broker never hears.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` (an ephemeral port) to ``upstream``."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.port = 0
        self.accepted = 0  # client connections forwarded so far
        self.dropped = 0  # connections reset by drop() or arm()
        self.accepted_after_drop = 0
        self._dropped_once = False
        self._armed: str | None = None
        self._blackout = 0.05
        self._cut: str | None = None  # the direction being discarded: requests / replies
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> TcpProxy:
        self._thread.start()
        self.port = self._call(self._start())
        return self

    def drop(self) -> int:
        """Reset every open connection now; returns how many there were."""
        return self._call(self._drop())

    def arm(self, lose: str, blackout: float = 0.05) -> None:
        """Drop every connection on the next request; see the module docstring."""
        if lose not in ("requests", "replies"):
            raise ValueError(lose)
        self._blackout = blackout
        self._loop.call_soon_threadsafe(setattr, self, "_armed", lose)

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def _call(self, coro: object) -> int:
        return int(asyncio.run_coroutine_threadsafe(coro, self._loop).result(10))  # type: ignore[arg-type]

    async def _start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        self.accepted += 1
        if self._dropped_once:
            self.accepted_after_drop += 1
        pipes = [
            asyncio.ensure_future(self._pipe(reader, up_writer, request=True)),
            asyncio.ensure_future(self._pipe(up_reader, writer, request=False)),
        ]
        self._tasks.update(pipes)
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pipes:
                task.cancel()
                self._tasks.discard(task)
            await asyncio.gather(*pipes, return_exceptions=True)
            self._pairs.discard(pair)
            for w in pair:
                w.transport.abort()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bool
    ) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                if request and self._armed and not self._cut:
                    self._cut, self._armed = self._armed, None
                    asyncio.get_running_loop().call_later(self._blackout, self._drop_soon)
                if self._cut == ("requests" if request else "replies"):
                    continue  # lost in the network
                writer.write(data)
                await writer.drain()

    def _drop_soon(self) -> None:
        task = asyncio.ensure_future(self._drop())
        self._tasks.add(task)  # type: ignore[arg-type]
        task.add_done_callback(self._tasks.discard)  # type: ignore[arg-type]

    async def _drop(self) -> int:
        pairs = list(self._pairs)
        self._dropped_once = True
        for pair in pairs:
            for w in pair:
                w.transport.abort()
        self.dropped += len(pairs)
        self._cut = None  # whoever reconnects finds the network back
        return len(pairs)

    async def _close(self) -> int:
        if self._server is not None:
            self._server.close()
        for pair in list(self._pairs):
            for w in pair:
                w.transport.abort()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        return 0
