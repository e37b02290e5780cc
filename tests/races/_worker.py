# SPDX-License-Identifier: MIT
"""A racing worker: delivers every key of ``KEYS`` (shuffled) once, in one of two modes.

* ``inbox``: ``Inbox.process`` with a handler that inserts one ledger row per run.
* ``leased``: an ``@idempotent`` function that appends one line per run to a file.

``test_races.py`` imports the helpers for its threads and runs this file as a script for
its processes::

    python _worker.py MODE URL TABLE WORKER SEED EFFECTS

(for a ``redis://`` URL, TABLE is the key prefix).

The script prints ``ready``, waits for one line on stdin (the start gun, so every
process races from the same instant), then prints a JSON list of what it got per key.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import onceonly

KEYS = [f"key-{i:02d}" for i in range(20)]
SCOPE = "races"
HANDLER_SLEEP = 0.005
DEADLINE = 30.0


def _shuffled(keys: list[str], seed: int) -> list[str]:
    out = list(keys)
    random.Random(seed).shuffle(out)
    return out


def _retry_in_flight(call: Callable[[], Any]) -> Any:
    """Call until it does not raise InFlight (a busy key); the delivery comes back later."""
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            return call()
        except onceonly.InFlight:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def process_all(store: Any, ledger: str, worker: str, seed: int) -> list[dict[str, Any]]:
    """Deliver every key through an Inbox; one ledger row and a 5 ms nap per handler run."""
    inbox = onceonly.Inbox(store, consumer=SCOPE, wait=5.0)

    def handler(payload: dict[str, Any], tx: onceonly.Tx) -> dict[str, Any]:
        tx.execute(f"INSERT INTO {ledger} (id, amount) VALUES (?, ?)", (payload["id"], 1))
        time.sleep(HANDLER_SLEEP)
        return {"id": payload["id"], "by": worker, "attempt": tx.attempt}

    got = []
    for key in _shuffled(KEYS, seed):
        payload = {"id": key, "amount": 1}
        outcome = _retry_in_flight(lambda k=key, p=payload: inbox.process(k, p, handler))
        got.append(
            {
                "key": outcome.key,
                "replayed": outcome.replayed,
                "attempt": outcome.attempt,
                "result": outcome.result,
            }
        )
    return got


def record_effect(path: str, line: str) -> None:
    """Append one line with a single O_APPEND write (atomic across threads and processes)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def read_effects(path: str) -> list[str]:
    """The lines ``record_effect`` appended (none when the file does not exist)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def leased_function(store: Any, worker: str, effects: str) -> Callable[[str], dict[str, Any]]:
    """An ``@idempotent`` function whose every run appends ``key`` to ``effects``."""

    def work(key: str) -> dict[str, Any]:
        claim = onceonly.current_claim()
        record_effect(effects, key)
        time.sleep(HANDLER_SLEEP)
        return {"id": key, "by": worker, "attempt": claim.attempt}

    return onceonly.idempotent(store, key=lambda key: key, scope=SCOPE, lease=10.0, wait=10.0)(work)


def call_all(fn: Callable[[str], dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """Call ``fn`` for every key; whether it ran here shows in the result's ``by``."""
    return [
        {"key": key, "result": _retry_in_flight(lambda k=key: fn(k))}
        for key in _shuffled(KEYS, seed)
    ]


def main(argv: list[str]) -> int:
    mode, url, table, worker, seed, effects = argv
    option = "prefix" if url.startswith("redis") else "table"
    store = onceonly.open_store(url, **{option: table})
    try:
        print("ready", flush=True)
        sys.stdin.readline()
        if mode == "inbox":
            got = process_all(store, f"{table}_ledger", worker, int(seed))
        else:
            got = call_all(leased_function(store, worker, effects), int(seed))
    finally:
        store.close()
    print(json.dumps(got), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
