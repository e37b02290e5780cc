# SPDX-License-Identifier: MIT
"""A worker that delivers one message and can SIGKILL itself at a chosen point.

``test_crash.py`` runs it as a script (one process per delivery) and imports
``leased_function`` to call the same ``@idempotent`` function in the test process.

Exit codes: 0 done (one JSON line on stdout), 3 ``LeaseLost``, 4 ``InFlight``,
5 ``DeadLettered``;
``-SIGKILL`` when it killed itself.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import onceonly

CONSUMER = "crash"
SCOPE = "crash-leased"
INBOX_POINTS = ("handler_start", "after_write", "before_commit", "before_ack")


def die() -> None:
    """Die like a power cut of the process: no cleanup, no rollback, no exit handlers."""
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(10)  # never reached


def append_line(path: str, data: Any) -> None:
    """Append one JSON line with a single O_APPEND write."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(data) + "\n").encode())
    finally:
        os.close(fd)


def read_lines(path: str) -> list[Any]:
    """The JSON lines ``append_line`` wrote (none when the file does not exist)."""
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f.read().splitlines()]
    except FileNotFoundError:
        return []


def kill_before_commit(store: Any, armed: Callable[[], bool]) -> None:
    """Make the store's transactions die after their body, just before COMMIT, once armed."""
    original = store.transaction

    @contextmanager
    def transaction(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with original(*args, **kwargs) as session:
            yield session
            if armed():
                die()

    store.transaction = transaction


def deliver(
    store: Any,
    key: str,
    run: str,
    kill: str | None,
    acks: str,
    *,
    max_attempts: int = 5,
    precount: bool = False,
) -> dict[str, Any]:
    """Process ``key`` through an Inbox (one ledger row), then acknowledge it in ``acks``."""
    ledger = f"{store.table}_ledger"
    ran = []
    if kill == "before_commit":
        kill_before_commit(store, lambda: bool(ran))

    def handler(payload: dict[str, Any], tx: onceonly.Tx) -> dict[str, Any]:
        if kill == "handler_start":
            die()
        tx.execute(f"INSERT INTO {ledger} (id, amount) VALUES (?, ?)", (payload["id"], 10))
        if kill == "after_write":
            die()
        ran.append(True)
        return {"run": run, "attempt": tx.attempt}

    inbox = onceonly.Inbox(
        store,
        consumer=CONSUMER,
        wait=5.0,
        max_attempts=max_attempts,
        precount_attempts=precount,
    )
    outcome = inbox.process(key, {"id": key, "amount": 10}, handler)
    if kill == "before_ack":
        die()
    got = {"result": outcome.result, "replayed": outcome.replayed, "attempt": outcome.attempt}
    append_line(acks, {"key": key, "run": run, **got})  # the broker ack, after the commit
    return got


def leased_function(
    store: Any,
    *,
    run: str,
    effects: str,
    lease: float = 1.0,
    wait: float = 0.1,
    kill: bool = False,
    checkpoint: Any = None,
    started: str | None = None,
    release: str | None = None,
) -> Callable[[str], dict[str, Any]]:
    """An ``@idempotent`` function that logs each run to ``effects`` and reports its claim.

    ``checkpoint``: saved as step ``step1`` first. ``started``: a file created once running.
    ``release``: a file awaited before returning. ``kill``: SIGKILL itself before returning.
    """

    def task(key: str) -> dict[str, Any]:
        claim = onceonly.current_claim()
        seen = dict(claim.checkpoints)
        append_line(effects, {"key": key, "run": run, "attempt": claim.attempt})
        if checkpoint is not None:
            claim.checkpoint("step1", checkpoint)
        if started is not None:
            Path(started).touch()
        if release is not None:
            while not os.path.exists(release):
                time.sleep(0.01)
        if kill:
            die()
        return {"run": run, "attempt": claim.attempt, "checkpoints": seen}

    return onceonly.idempotent(store, key=lambda key: key, scope=SCOPE, lease=lease, wait=wait)(
        task
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["inbox", "leased"])
    parser.add_argument("url")
    parser.add_argument("table")
    parser.add_argument("key")
    parser.add_argument("--run", required=True)
    parser.add_argument("--kill", default=None)
    parser.add_argument("--acks", default=os.devnull)
    parser.add_argument("--effects", default=os.devnull)
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--checkpoint", type=json.loads, default=None)
    parser.add_argument("--started", default=None)
    parser.add_argument("--release", default=None)
    parser.add_argument("--max-attempts", type=int, default=5)
    parser.add_argument("--precount", action="store_true")
    args = parser.parse_args(argv)
    option = "prefix" if args.url.startswith("redis") else "table"  # redis: a key prefix
    store = onceonly.open_store(args.url, **{option: args.table})
    if args.mode == "inbox":
        if args.kill is not None and args.kill not in INBOX_POINTS:
            parser.error(f"unknown kill point {args.kill!r}")
        try:
            got = deliver(
                store,
                args.key,
                args.run,
                args.kill,
                args.acks,
                max_attempts=args.max_attempts,
                precount=args.precount,
            )
        except onceonly.DeadLettered as exc:
            print(json.dumps({"error": "DeadLettered", "attempts": exc.attempts}), flush=True)
            return 5
    else:
        fn = leased_function(
            store,
            run=args.run,
            effects=args.effects,
            lease=args.lease,
            kill=args.kill == "in_function",
            checkpoint=args.checkpoint,
            started=args.started,
            release=args.release,
        )
        try:
            got = {"result": fn(args.key)}
        except onceonly.LeaseLost as exc:
            print(json.dumps({"error": "LeaseLost", "message": str(exc)}), flush=True)
            return 3
        except onceonly.InFlight as exc:
            print(json.dumps({"error": "InFlight", "message": str(exc)}), flush=True)
            return 4
    store.close()
    print(json.dumps(got), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
