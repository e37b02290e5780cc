# SPDX-License-Identifier: MIT
"""Start the test apps under real servers (uvicorn, waitress) as processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(server: str, port: int) -> list[str]:
    if server in ("uvicorn", "django-asgi"):
        app = (
            "tests.http.apps.django_site:asgi_application"
            if server == "django-asgi"
            else "tests.http.apps.asgi_app:app"
        )
        return [
            sys.executable, "-m", "uvicorn", app,
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
        ]  # fmt: skip
    target = (
        "tests.http.apps.django_site:application"
        if server == "django"
        else ("tests.http.apps.wsgi_app:app")
    )
    return [
        sys.executable, "-m", "waitress", "--host=127.0.0.1", f"--port={port}",
        "--threads=20", target,
    ]  # fmt: skip


class Server:
    def __init__(self, server: str, env: dict[str, str], port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            command(server, self.port),
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{server} exited: {self.proc.stderr.read().decode()}")  # type: ignore[union-attr]
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@contextmanager
def serve(server: str, env: dict[str, str]) -> Iterator[Server]:
    s = Server(server, env)
    try:
        yield s
    finally:
        s.stop()
