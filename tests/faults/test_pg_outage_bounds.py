# SPDX-License-Identifier: MIT
"""PostgreSQL outages that cost far more than the store's bounds.

1. A server that refuses connections: only the first call fails fast; every later call
   waits the whole pool timeout (30 s) for a connection that can never be made, although
   ``connect_timeout=1`` (docs/stores.md: "an unreachable server fails fast"). A leased
   completion retries that 5 times, so it takes minutes, far past its 30 s lease.
2. A server that stops answering (SIGSTOP, a half-open connection; emulated by a proxy
   that swallows replies): the call never returns. Redis has ``socket_timeout``; the
   PostgreSQL store has no bound at all, so the delivery is stuck for ever.
"""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest

import onceonly
from tests.faults._cutproxy import Proxy

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


@pytest.fixture
def dbname():
    name = f"atk_outage_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    yield name
    with psycopg.connect(PG_ADMIN, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_refused_connections_fail_fast_on_every_call(dbname):
    proxy = Proxy(5432)
    store = onceonly.open_store(
        f"postgresql://postgres@127.0.0.1:{proxy.port}/{dbname}", migrate=True, connect_timeout=1
    )
    try:
        inbox = onceonly.Inbox(store, consumer="atk-outage")
        inbox.process("warm", {}, lambda m, tx: 1)
        proxy.mode = "cut"  # the server is down: connections refused
        took = []
        for i in range(3):
            started = time.monotonic()
            with pytest.raises(onceonly.StoreUnavailable):
                inbox.process(f"k{i}", {}, lambda m, tx: 1)
            took.append(round(time.monotonic() - started, 2))
        assert max(took) < 10, f"seconds per call while the server refuses connections: {took}"
    finally:
        proxy.close()
        store.close()


def test_a_server_that_stops_answering_does_not_hang_the_call(dbname):
    proxy = Proxy(5432)
    store = onceonly.open_store(
        f"postgresql://postgres@127.0.0.1:{proxy.port}/{dbname}", migrate=True, connect_timeout=1
    )
    done = threading.Event()
    outcome = {}

    def call():
        try:
            outcome["r"] = onceonly.Inbox(store, consumer="atk-stall").process(
                "k", {}, lambda m, tx: 1
            )
        except Exception as exc:
            outcome["r"] = exc
        done.set()

    try:
        onceonly.Inbox(store, consumer="atk-stall").process("warm", {}, lambda m, tx: 1)
        proxy.mode = "drop"  # SIGSTOP-like: requests arrive, nothing comes back
        t = threading.Thread(target=call, daemon=True)
        t.start()
        finished = done.wait(30)
        assert finished, "the call is still blocked after 30 s (no read timeout on PostgreSQL)"
        assert isinstance(outcome["r"], onceonly.StoreUnavailable)
    finally:
        proxy.close()  # unblocks the call
        done.wait(10)
        store.close()
