# SPDX-License-Identifier: MIT
"""A loopback TCP proxy for the attack tests: 'pass', 'drop' (requests go through,
replies are swallowed) or 'cut' (every connection closed, new ones refused)."""

from __future__ import annotations

import contextlib
import select
import socket
import threading


class Proxy:
    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.mode = "pass"
        self.conns: list[tuple[socket.socket, socket.socket]] = []
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(64)
        self.port = self.ls.getsockname()[1]
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            if self.mode == "cut":
                c.close()
                continue
            s = socket.create_connection(self.target)
            self.conns.append((c, s))
            threading.Thread(target=self._pump, args=(c, s), daemon=True).start()

    def _pump(self, c: socket.socket, s: socket.socket) -> None:
        try:
            while not self.stopped:
                r, _, _ = select.select([c, s], [], [], 0.05)
                if self.mode == "cut":
                    break
                for x in r:
                    data = x.recv(65536)
                    if not data:
                        raise OSError
                    if x is c:
                        s.sendall(data)
                    elif self.mode != "drop":
                        c.sendall(data)
        except (OSError, ValueError):
            pass
        for x in (c, s):
            with contextlib.suppress(OSError):
                x.close()

    def close(self) -> None:
        self.stopped = True
        self.ls.close()
        for c, s in self.conns:
            for x in (c, s):
                with contextlib.suppress(OSError):
                    x.close()
