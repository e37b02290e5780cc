# SPDX-License-Identifier: MIT
"""A record that kills the worker must be the only one dead-lettered.

With ``precount_attempts=True`` a poison record is counted and dead-lettered at
``max_attempts``. But the records of other keys that were running beside it when it
killed the process are pre-counted on every crash too, and the consumer does not run
records alone after the restart: after ``max_attempts`` crashes the innocent records are
dead-lettered (reason ``dead-lettered``) although their handler never failed, and their
effect never commits.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid

from ._kafka_attack_util import BOOTSTRAP, create_topic, private_database, produce, read_all, require_services

WORKER = textwrap.dedent(
    """
    import asyncio, os, signal, sys, time
    import onceonly
    from onceonly.brokers.kafka import KafkaConsumer

    DB, TOPIC, GROUP, BOOTSTRAP = sys.argv[1:5]

    async def main():
        store = onceonly.open_async_store(DB, max_size=20)
        await store.migrate()
        async with store.transaction() as s:
            await s.execute("CREATE TABLE IF NOT EXISTS ledger (n INTEGER)")
        inbox = onceonly.AsyncInbox(store, consumer="billing", precount_attempts=True, max_attempts=3)

        async def handler(msg, tx):
            if msg.get("poison"):
                await asyncio.sleep(0.3)          # the others are running by now
                os.kill(os.getpid(), signal.SIGKILL)
            await asyncio.sleep(1.0)
            await tx.execute("INSERT INTO ledger (n) VALUES (?)", (msg["n"],))

        consumer = KafkaConsumer(inbox, handler, topics=[TOPIC], group=GROUP, bootstrap=BOOTSTRAP,
                                 config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000})
        task = asyncio.create_task(consumer.run())
        start = time.monotonic()
        while time.monotonic() - start < 20:
            async with store.session() as s:
                cur = await s.execute("SELECT count(*) FROM ledger")
                if (await cur.fetchone())[0] >= 4:
                    await asyncio.sleep(2)
                    break
            await asyncio.sleep(0.5)
        await consumer.stop()
        await task
        await store.close()

    asyncio.run(main())
    """
)


def test_poison_record_does_not_dead_letter_its_neighbours(tmp_path):
    require_services()
    import psycopg

    db, drop = private_database()
    run = uuid.uuid4().hex[:8]
    topic, group = f"attack-poison-{run}", f"attack-poison-{run}"
    try:
        create_topic(topic, 1)
        produce(topic, [
            dict(value=json.dumps({"n": i, "poison": i == 2}).encode(), key=f"k{i}".encode(),
                 headers=[("onceonly-message-id", f"{run}-{i}".encode())])
            for i in range(5)
        ])
        script = tmp_path / "worker.py"
        script.write_text(WORKER)
        env = dict(os.environ)
        crashes = 0
        for _ in range(8):  # bounded: a killed worker is restarted, as a supervisor would
            proc = subprocess.run([sys.executable, str(script), db, topic, group, BOOTSTRAP],
                                  env=env, timeout=90, capture_output=True)
            if proc.returncode != -9:
                assert proc.returncode == 0, proc.stderr.decode()[-2000:]
                break
            crashes += 1
        with psycopg.connect(db) as conn:
            ledger = sorted(r[0] for r in conn.execute("SELECT n FROM ledger"))
        dead = sorted(json.loads(m.value())["n"] for m in read_all(topic + ".dead"))
        assert crashes >= 1
        # only the poison record is dead-lettered; the four others commit once
        assert dead == [2], f"dead-lettered {dead} after {crashes} crashes (ledger {ledger})"
        assert ledger == [0, 1, 3, 4]
    finally:
        drop()
