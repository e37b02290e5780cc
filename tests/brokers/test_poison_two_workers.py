"""A worker-killing message on a quorum queue with two batch consumers: only it is
dead-lettered (docs/brokers.md, "A worker that crashes").

The poison's first crash sends everything its worker held back, counted, to the other
(widened) worker, together with the poison. There each redelivered message runs alone
and exclusively, its attempt counted in the store first: the poison's second crash
counts only the poison in the store, though the broker counts every message that worker
held. A message the broker counts past ``max_deliveries`` is dead-lettered only when the
store counted ``max_deliveries - 1`` attempts of its own; the others run and commit.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

aio_pika = pytest.importorskip("aio_pika")
import onceonly  # noqa: E402
from tests.brokers._kits import AMQP_URL as AMQP  # noqa: E402
from tests.conftest import PG_URL as PG  # noqa: E402

pytestmark = pytest.mark.timeout(120)
SRC = str(Path(__file__).resolve().parents[2] / "src")

WORKER = r"""
import asyncio, os, signal, sys
import onceonly
from onceonly.brokers.rabbitmq import RabbitMQConsumer

DB, Q, T = sys.argv[1], sys.argv[2], sys.argv[3]

async def main():
    store = onceonly.open_async_store(DB, max_size=20)
    inbox = onceonly.AsyncInbox(store, consumer=Q)

    async def handler(p, tx):
        await tx.execute(f"INSERT INTO {T} (n) VALUES (?)", (str(p["n"]),))
        await asyncio.sleep(0.3)
        if p.get("poison"):
            os.kill(os.getpid(), signal.SIGKILL)

    async with RabbitMQConsumer(inbox, handler, queue=Q, url=sys.argv[4], batch_size=5,
                                max_deliveries=2, batch_wait=0.2, max_backoff=0.2):
        await asyncio.sleep(120)

asyncio.run(main())
"""


async def test_poison_with_two_batch_workers_dead_letters_only_the_poison(tmp_path):
    tag = uuid.uuid4().hex[:8]
    queue, table = f"poison-two-{tag}", f"poison_two_{tag}"
    store = onceonly.open_async_store(PG)
    await store.migrate()
    async with store.transaction() as s:
        await s.execute(f"CREATE TABLE {table} (n TEXT)")
    conn = await aio_pika.connect(AMQP)
    ch = await conn.channel()
    await ch.declare_queue(
        queue,
        durable=True,
        arguments={
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": queue + ".dead",
        },
    )
    await ch.declare_queue(queue + ".dead", durable=True, arguments={"x-queue-type": "quorum"})
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, PYTHONPATH=SRC)
    args = [sys.executable, str(script), PG, queue, table, AMQP]
    log = (tmp_path / "workers.log").open("w")
    procs = [
        subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env) for _ in range(2)
    ]
    try:
        await asyncio.sleep(3)
        # one fresh message each: both workers leave the cautious start
        for i in range(2):
            body = json.dumps({"n": f"warm{i}"}).encode()
            await ch.default_exchange.publish(
                aio_pika.Message(body, message_id=f"warm{i}"), routing_key=queue
            )
        await asyncio.sleep(1.5)
        for i in range(9):
            payload = {"n": i, "poison": True} if i == 0 else {"n": i}
            body = json.dumps(payload).encode()
            await ch.default_exchange.publish(
                aio_pika.Message(body, message_id=f"m{i}"), routing_key=queue
            )
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            for j, p in enumerate(procs):
                if p.poll() is not None:  # a crashed worker is restarted, as a supervisor would
                    procs[j] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
            main_q = await ch.declare_queue(queue, passive=True)
            dead_q = await ch.declare_queue(queue + ".dead", passive=True)
            async with store.session() as s:
                cur = await s.execute(f"SELECT count(DISTINCT n) FROM {table}")
                done = (await cur.fetchone())[0]
            if (
                main_q.declaration_result.message_count == 0
                and done + dead_q.declaration_result.message_count >= 11
            ):
                break
        await asyncio.sleep(1)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        log.close()
    dead = []
    dq = await ch.declare_queue(queue + ".dead", passive=True)
    while (m := await dq.get(no_ack=True, fail=False)) is not None:
        dead.append((m.message_id, m.headers.get("onceonly-dead-reason")))
    async with store.session() as s:
        cur = await s.execute(f"SELECT n, count(*) FROM {table} GROUP BY n")
        counts = dict(await cur.fetchall())
    async with store.transaction() as s:
        await s.execute(f"DROP TABLE {table}")
    await ch.queue_delete(queue)
    await ch.queue_delete(queue + ".dead")
    await conn.close()
    await store.close()

    assert dead == [("m0", "max-deliveries")], f"innocent messages dead-lettered: {dead}"
    assert counts == {str(i): 1 for i in range(1, 9)} | {"warm0": 1, "warm1": 1}
