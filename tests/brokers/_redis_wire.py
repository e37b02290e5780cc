# SPDX-License-Identifier: MIT
"""A loopback TCP proxy in front of Redis that counts, on the wire, the commands clients
send (by name) and the round trips: a round trip is a burst of client bytes sent after
the server's last reply on that connection (a pipeline is one burst)."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections import Counter


class _Commands:
    """Splits a RESP request stream into commands (arrays of bulk strings)."""

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, data: bytes) -> list[list[bytes]]:
        self.buf += data
        commands: list[list[bytes]] = []
        while True:
            parsed = self._one()
            if parsed is None:
                return commands
            commands.append(parsed)

    def _one(self) -> list[bytes] | None:
        buf = self.buf
        end = buf.find(b"\r\n")
        if end < 0 or not buf.startswith(b"*"):
            return None
        n, pos, args = int(buf[1:end]), end + 2, []
        for _ in range(n):
            end = buf.find(b"\r\n", pos)
            if end < 0:
                return None
            size = int(buf[pos + 1 : end])
            start, pos = end + 2, end + 2 + size + 2
            if len(buf) < pos:
                return None
            args.append(buf[start : start + size])
        self.buf = buf[pos:]
        return args


class CountingProxy:
    """Forwards 127.0.0.1:``port`` to Redis at ``target``; counts what passes."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.lock = threading.Lock()
        self.commands: Counter[str] = Counter()
        #: every command, as its arguments (the name upper-cased)
        self.sent: list[list[bytes]] = []
        #: round trips, each as the command names it carried
        self.trips: list[list[str]] = []
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(64)
        self.port = self.ls.getsockname()[1]
        self.stopped = False
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def reset(self) -> None:
        with self.lock:
            self.commands.clear()
            self.sent.clear()
            self.trips.clear()

    def _accept(self) -> None:
        while not self.stopped:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            s = socket.create_connection(self.target)
            self.socks += [c, s]
            threading.Thread(target=self._pump, args=(c, s), daemon=True).start()

    def _pump(self, c: socket.socket, s: socket.socket) -> None:
        parser = _Commands()
        replied = True  # the next client bytes start a round trip
        trip: list[str] = []
        try:
            while not self.stopped:
                ready, _, _ = select.select([c, s], [], [], 0.05)
                for x in ready:
                    data = x.recv(65536)
                    if not data:
                        raise OSError
                    if x is c:
                        sent = parser.feed(data)
                        names = [args[0].decode().upper() for args in sent]
                        with self.lock:
                            self.commands.update(names)
                            self.sent += (
                                [n.encode(), *a[1:]] for n, a in zip(names, sent, strict=True)
                            )
                            if replied:
                                trip = []
                                self.trips.append(trip)
                                replied = False
                            trip.extend(names)
                        s.sendall(data)
                    else:
                        replied = True
                        c.sendall(data)
        except (OSError, ValueError):
            pass
        for x in (c, s):
            with contextlib.suppress(OSError):
                x.close()

    def close(self) -> None:
        self.stopped = True
        self.ls.close()
        for x in self.socks:
            with contextlib.suppress(OSError):
                x.close()
