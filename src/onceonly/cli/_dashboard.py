# SPDX-License-Identifier: MIT
"""``onceonly dashboard``: serve :func:`onceonly.dashboard.app` over HTTP (uvicorn).

Binds the loopback interface unless ``--host`` says otherwise. The token comes from the
``ONCEONLY_DASHBOARD_TOKEN`` environment variable only (a command-line argument would
show in ``ps``); without it the dashboard is read-only. Before serving it reads the
store once: a database that does not exist, a refused login or unmigrated tables exit 2
and an unreachable store exits 3 (as every command does), instead of serving pages that
all say so. Prints the URL to open once the socket is bound and the store answered (with
``--port 0``, the port the system chose).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import signal
import socket
import sys
from collections.abc import Iterator

from onceonly._core.urls import redact_url
from onceonly.cli._store import add_create_option, check_sqlite_exists
from onceonly.errors import ConfigurationError

__all__ = ["TOKEN_VARIABLE", "configure_dashboard", "run_dashboard"]

TOKEN_VARIABLE = "ONCEONLY_DASHBOARD_TOKEN"


def configure_dashboard(parser: argparse.ArgumentParser) -> None:
    """Add the ``dashboard`` options to ``parser``."""
    parser.add_argument("--url", required=True, help="the store URL (sqlite:///…, postgresql://…)")
    parser.add_argument("--table", help="the records table (default: onceonly_records)")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default: 127.0.0.1, this machine only)",
    )
    parser.add_argument(
        "--port", type=int, default=8000, help="the port (default: 8000; 0: any free port)"
    )
    parser.add_argument("--title", default="onceonly", help="the page header's title")
    parser.add_argument(
        "--store-timeout",
        type=float,
        default=5.0,
        help="seconds a page waits for the store before answering 503 (default: 5)",
    )
    add_create_option(parser)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


async def _serve(args: argparse.Namespace, sock: socket.socket) -> None:
    import uvicorn

    class _Server(uvicorn.Server):
        """uvicorn's server, stopped by our signal handlers (uvicorn's own re-raise the
        signal after shutting down, which would end the process with its status)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

        def stop(self) -> None:
            self.should_exit = True

    from onceonly.admin import AsyncAdmin
    from onceonly.dashboard import app
    from onceonly.stores import open_async_store

    store = open_async_store(args.url, **({"table": args.table} if args.table else {}))
    try:
        token = os.environ.get(TOKEN_VARIABLE) or None
        asgi = app(store, token=token, title=args.title, store_timeout=args.store_timeout)
        await AsyncAdmin(store).clock()  # the store answers and is migrated, or we stop here
        _announce(args, sock)
        config = uvicorn.Config(asgi, log_level="warning", lifespan="off", server_header=False)
        server = _Server(config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # a clean stop, exit status 0
            loop.add_signal_handler(sig, server.stop)
        await server.serve(sockets=[sock])
    finally:
        await store.close()


def _announce(args: argparse.Namespace, sock: socket.socket) -> None:
    port = sock.getsockname()[1]
    host = f"[{args.host}]" if ":" in args.host else args.host
    err = sys.stderr
    err.write(f"onceonly dashboard: {redact_url(args.url)}\n")
    if not os.environ.get(TOKEN_VARIABLE):
        err.write(f"read-only: set {TOKEN_VARIABLE} to allow redrive, release and delete\n")
    if not _loopback(args.host):
        err.write(f"warning: listening on {args.host}, reachable from other machines\n")
    sys.stdout.write(f"http://{host}:{port}/\n")
    sys.stdout.flush()


def run_dashboard(args: argparse.Namespace) -> int:
    """Run ``onceonly dashboard``; returns the exit status."""
    try:
        import uvicorn  # noqa: F401

        import onceonly.dashboard  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError(
            "onceonly dashboard needs the dashboard extra: pip install 'onceonly[dashboard]'"
        ) from exc
    check_sqlite_exists(args.url, args)
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        sock.close()
        raise ConfigurationError(f"cannot listen on {args.host}:{args.port}: {exc}") from exc
    sock.listen(128)
    sock.set_inheritable(True)
    try:
        asyncio.run(_serve(args, sock))
    finally:
        sock.close()
    return 0
