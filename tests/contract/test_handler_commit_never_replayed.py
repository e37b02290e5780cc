# SPDX-License-Identifier: MIT
"""A handler that ends the inbox's transaction itself must never be reported a success.

docs/spec.md §1.3.1a: "a delivery is reported as a success only when its claim and its
writes committed in one transaction"; changelog.d/20.handler-transaction.fix.md: "never a
`completed` record with a null result".

Atomic mode writes the claim directly as ``completed`` (§1.1). A handler that sends
``COMMIT`` (PostgreSQL, MariaDB) or calls ``tx.connection.commit()`` (MariaDB) commits that
``completed`` row with a null result. The inbox later turns it into ``failed`` and raises
``TransactionEnded`` to the first delivery, but in between a concurrent duplicate reads
``completed`` and is answered a replayed success with ``None`` (it acks the message). A
worker killed in between leaves the key ``completed`` with ``None`` for ever.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

import onceonly

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
MY = "mysql://root@127.0.0.1:3306/"


@pytest.fixture(params=["postgres", "mariadb"])
def url(request):
    name = f"atk_commit_{uuid.uuid4().hex[:10]}"
    if request.param == "postgres":
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
        with psycopg.connect(PG_ADMIN, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    else:
        import pymysql

        c = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
        c.cursor().execute(f"CREATE DATABASE `{name}`")
        yield f"mysql://root@127.0.0.1:3306/{name}"
        c.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        c.close()


def test_duplicate_during_handler_commit_is_not_a_replayed_success(url):
    store = onceonly.open_store(url, migrate=True)
    try:
        inbox = onceonly.Inbox(store, consumer="commit-race", wait=10, max_attempts=3)
        committed, go = threading.Event(), threading.Event()

        def misbehaving(msg, tx):
            tx.execute("COMMIT")  # the misuse the docs say is counted, never a success
            committed.set()
            go.wait(5)
            return {"v": 1}

        results = {}

        def run(name, handler):
            try:
                results[name] = inbox.process("k", {"n": 1}, handler)
            except Exception as exc:
                results[name] = exc

        first = threading.Thread(target=run, args=("first", misbehaving))
        first.start()
        assert committed.wait(5)
        second = threading.Thread(target=run, args=("second", lambda m, tx: {"v": 2}))
        second.start()
        time.sleep(0.5)
        go.set()
        first.join(10)
        second.join(10)

        assert isinstance(results["first"], onceonly.TransactionEnded)
        dup = results["second"]
        # The first run was not a success, so its duplicate must not be answered one.
        assert not (isinstance(dup, onceonly.Outcome) and dup.replayed), (
            f"duplicate acked as a replayed success with result {dup.result!r} while the "
            "first delivery failed with TransactionEnded"
        )
    finally:
        store.close()


def test_worker_killed_after_handler_commit_leaves_no_completed_record(url, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, signal, onceonly
        store = onceonly.open_store({url!r}, migrate=True)
        inbox = onceonly.Inbox(store, consumer="commit-kill", max_attempts=3)
        def misbehaving(msg, tx):
            tx.execute("COMMIT")
            os.kill(os.getpid(), signal.SIGKILL)
        inbox.process("k", {{"n": 1}}, misbehaving)
    """)
    )
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, str(script)], env=env, timeout=60)
    assert proc.returncode == -9
    store = onceonly.open_store(url)
    try:
        ran = []
        inbox = onceonly.Inbox(store, consumer="commit-kill", max_attempts=3)
        out = inbox.process("k", {"n": 1}, lambda m, tx: ran.append(1) or "done")
        # The killed run never succeeded: the redelivery must run the handler, not replay
        # a success (with a null result) that never happened.
        assert not out.replayed and ran == [1], f"replayed {out.result!r}, handler ran {len(ran)}x"
    finally:
        store.close()
