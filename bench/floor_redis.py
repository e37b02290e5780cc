# SPDX-License-Identifier: MIT
"""Leased ``@onceonly.idempotent`` on ``RedisStore`` against the Redis floor, interleaved.

The floor is what any Redis idempotency layer must at least send, with redis-py:

* **new key**: ``SET key v NX EX lease`` (the claim), then ``SET key result EX ttl``
  (the completion): two commands;
* **replay**: one ``SET key v NX EX lease`` that fails (the key is there).

onceonly protects a no-op ``f(key) -> 1`` with ``@idempotent(store, lease=30,
ttl=3600)``; new keys are never seen before, replays cycle over keys completed
beforehand. Concurrency 1 and 8 (threads). onceonly and the floor alternate in
``--slice`` second slices (medians of ``--slices``), so both see the same machine load;
the load average is printed before and after. A private ``redis-server`` on a free
port keeps other programs' traffic out of the server (the CPU is still shared). CPU per
call is summed over all slices: this process (user + system) and the ``redis-server``
(from ``/proc``, 10 ms ticks), which moves less with the machine's load than calls/s.

Round trips are counted in a separate untimed pass: one per ``send_packed_command``
of a redis-py connection (a pipeline's commands would count once).

    .venv/bin/python bench/floor_redis.py [--slices 8] [--slice 0.5]

Whether redis-py parses replies with hiredis is printed (``pip install hiredis``, or
the ``redis`` extra, which brings it). With ``--peers``, AWS Lambda Powertools'
``idempotent_function`` on its ``RedisCachePersistenceLayer`` (sync, local cache off)
takes its turn in the same slices; install it in an environment of the bench's own
(see bench/peers_redis.py, which also has idemkit, async only).
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import redis
import redis.connection
import redis.utils

import onceonly

SENT = [0]
REPLAY_KEYS = 1000


def _count_sends() -> None:
    cls: Any = redis.connection.AbstractConnection
    original = cls.send_packed_command

    def send(self: Any, *args: Any, **kwargs: Any) -> Any:
        SENT[0] += 1
        return original(self, *args, **kwargs)

    cls.send_packed_command = send


def start_redis() -> tuple[subprocess.Popen[bytes], int, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    home = tempfile.mkdtemp(prefix="floor-redis-")
    binary = shutil.which("redis-server") or "redis-server"
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", home],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc, port, home
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def server_cpu(pid: int) -> float:
    """CPU seconds (user + system) the process ``pid`` used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rate(fn: Callable[[int], Any], threads: int, seconds: float) -> tuple[float, int]:
    """Calls per second of ``fn(thread index)`` by ``threads`` threads for ``seconds``,
    and the number of calls."""
    counts = [0] * threads
    stop = threading.Event()
    barrier = threading.Barrier(threads + 1)

    def work(i: int) -> None:
        barrier.wait()
        n = 0
        while not stop.is_set():
            fn(i)
            n += 1
        counts[i] = n

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in pool:
        t.join()
    return sum(counts) / (time.perf_counter() - started), sum(counts)


def powertools_fn(port: int) -> Callable[[str], Any]:
    """AWS Lambda Powertools protecting the same no-op, as bench/peers_redis.py does."""
    from aws_lambda_powertools.utilities.idempotency import (
        IdempotencyConfig,
        idempotent_function,
    )
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
    )

    layer = RedisCachePersistenceLayer(client=redis.Redis(port=port))
    config = IdempotencyConfig(expires_after_seconds=3600, use_local_cache=False)

    @idempotent_function(data_keyword_argument="order", persistence_store=layer, config=config)
    def f(order: dict[str, str]) -> int:
        return 1

    return lambda order_id: f(order={"id": order_id})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slices", type=int, default=8, help="slices per library and cell")
    parser.add_argument("--slice", type=float, default=0.5, help="seconds per slice")
    parser.add_argument("--peers", action="store_true", help="add Powertools (installed)")
    args = parser.parse_args()
    _count_sends()
    proc, port, home = start_redis()
    url = f"redis://127.0.0.1:{port}/0"
    store = onceonly.open_store(url, prefix="oo:")
    store.migrate()
    client = redis.Redis(port=port)

    @onceonly.idempotent(store, key=lambda k: k, scope="bench.f", lease=30, ttl=3600)
    def f(k: str) -> int:
        return 1

    fresh = itertools.count()
    cycle = itertools.count()  # itertools counters are safe to share between threads

    def oo_new(i: int) -> None:
        f(f"n-{next(fresh)}")

    def oo_replay(i: int) -> None:
        f(f"r-{next(cycle) % REPLAY_KEYS}")

    def floor_new(i: int) -> None:
        k = f"fl:n-{next(fresh)}"
        client.set(k, "in_progress", nx=True, ex=30)
        client.set(k, "1", ex=3600)

    def floor_replay(i: int) -> None:
        client.set(f"fl:r-{next(cycle) % REPLAY_KEYS}", "in_progress", nx=True, ex=30)

    cells: dict[str, dict[str, Callable[[int], None]]] = {
        "new": {"onceonly": oo_new, "floor": floor_new},
        "replay": {"onceonly": oo_replay, "floor": floor_replay},
    }
    if args.peers:
        # its deprecation of the Redis layer and its "no Lambda context" warning per call
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message="Couldn't determine the remaining time")
        powertools = powertools_fn(port)
        cells["new"]["powertools"] = lambda i: powertools(f"pn-{next(fresh)}")
        cells["replay"]["powertools"] = lambda i: powertools(f"pr-{next(cycle) % REPLAY_KEYS}")
    try:
        for i in range(REPLAY_KEYS):
            f(f"r-{i}")
            client.set(f"fl:r-{i}", "1", ex=3600)
            if args.peers:
                powertools(f"pr-{i}")
        trips = {}
        for workload, pair in cells.items():
            for name, fn in pair.items():
                SENT[0] = 0
                for _ in range(200):
                    fn(0)
                trips[workload, name] = SENT[0] / 200
        load_before = os.getloadavg()
        rates: dict[tuple[str, str, int], float] = {}
        cpu: dict[tuple[str, str, int], tuple[float, float]] = {}
        for workload, pair in cells.items():
            for threads in (1, 8):
                got: dict[str, list[float]] = {name: [] for name in pair}
                used = {name: [0, 0.0, 0.0] for name in pair}  # calls, client s, server s
                for _ in range(args.slices):  # alternate: both see the same load
                    for name, fn in pair.items():
                        client0, server0 = time.process_time(), server_cpu(proc.pid)
                        per_second, calls = rate(fn, threads, args.slice)
                        got[name].append(per_second)
                        used[name][0] += calls
                        used[name][1] += time.process_time() - client0
                        used[name][2] += server_cpu(proc.pid) - server0
                for name in pair:
                    rates[workload, name, threads] = statistics.median(got[name])
                    calls, client_s, server_s = used[name]
                    cpu[workload, name, threads] = (
                        client_s / calls * 1e6,
                        server_s / calls * 1e6,
                    )
        load_after = os.getloadavg()
    finally:
        store.close()
        client.close()
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(home, ignore_errors=True)
    print(
        f"@idempotent no-op on RedisStore vs the floor; calls/s, median of {args.slices} "
        f"slices of {args.slice:g} s, interleaved; hiredis: {redis.utils.HIREDIS_AVAILABLE}"
    )
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (2 cores)")
    print(
        f"{'workload':<20} {'conc':>4} {'onceonly/s':>11} {'floor/s':>9} {'ratio':>6}  "
        f"{'CPU µs/call client + server: onceonly':<38} {'floor':<14} trips"
    )
    for workload, pair in cells.items():
        for threads in (1, 8):
            for name in pair:
                if name == "floor":
                    continue
                ours, floor = rates[workload, name, threads], rates[workload, "floor", threads]
                oc, os_ = cpu[workload, name, threads]
                fc, fs = cpu[workload, "floor", threads]
                label = workload if name == "onceonly" else f"{workload} ({name})"
                print(
                    f"{label:<20} {'c' + str(threads):>4} {ours:>11,.0f} {floor:>9,.0f} "
                    f"{ours / floor:>5.2f}x  {f'{oc:.0f} + {os_:.0f}':<38} "
                    f"{f'{fc:.0f} + {fs:.0f}':<14} {trips[workload, name]:g} vs "
                    f"{trips[workload, 'floor']:g}"
                )


if __name__ == "__main__":
    main()
