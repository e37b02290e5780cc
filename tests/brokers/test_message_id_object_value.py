"""``message_id="<field>"`` when the field's value is an object (docs/brokers.md,
"Which id is the key").

Taken through Python's ``str()``, an object-valued id was its ``repr``, which depends on
the producer's key order: the same event re-serialized with its keys in another order
(same canonical JSON, same fingerprint) got a second key and ran twice. An id that is
neither a string nor an integer is refused as ``invalid-id``, on the field and the
callable paths alike (tests/brokers/test_contract.py covers both on every broker).
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

aio_pika = pytest.importorskip("aio_pika")
import onceonly  # noqa: E402
from onceonly.brokers.rabbitmq import RabbitMQConsumer  # noqa: E402
from tests.brokers._kits import AMQP_URL as AMQP  # noqa: E402
from tests.conftest import PG_URL as PG  # noqa: E402


async def test_same_event_with_reordered_object_id_runs_once():
    tag = uuid.uuid4().hex[:8]
    queue, table = f"attack-field-{tag}", f"attack_field_{tag}"
    store = onceonly.open_async_store(PG, max_size=16)
    await store.migrate()
    async with store.transaction() as s:
        await s.execute(f"CREATE TABLE {table} (k TEXT)")
    inbox = onceonly.AsyncInbox(store, consumer=queue)
    keys = []

    async def handler(payload, tx):
        keys.append(tx.key)
        await tx.execute(f"INSERT INTO {table} (k) VALUES (?)", (tx.key,))

    conn = await aio_pika.connect(AMQP)
    ch = await conn.channel()
    bodies = [
        json.dumps({"event_id": {"order": "o-1", "line": 1}, "amount": 5}),
        json.dumps({"event_id": {"line": 1, "order": "o-1"}, "amount": 5}),  # the same JSON value
    ]
    try:
        async with RabbitMQConsumer(
            inbox, handler, queue=queue, url=AMQP, message_id="event_id", max_backoff=0.2
        ):
            for i, body in enumerate(bodies):
                await ch.default_exchange.publish(
                    aio_pika.Message(body.encode(), message_id=f"p{i}"), routing_key=queue
                )
            for _ in range(50):
                await asyncio.sleep(0.1)
                q = await ch.declare_queue(queue, passive=True)
                if q.declaration_result.message_count == 0 and keys:
                    break
            await asyncio.sleep(1)
        dead = []
        dq = await ch.declare_queue(queue + ".dead", passive=True)
        while (m := await dq.get(no_ack=True, fail=False)) is not None:
            dead.append(m.headers.get("onceonly-dead-reason"))
        async with store.session() as s:
            cur = await s.execute(f"SELECT count(*) FROM {table}")
            effects = (await cur.fetchone())[0]
    finally:
        await ch.queue_delete(queue)
        await ch.queue_delete(queue + ".dead")
        await conn.close()
        async with store.transaction() as s:
            await s.execute(f"DROP TABLE {table}")
        await store.close()
    assert effects == 0, f"the same event ran {effects} times under keys {keys}"
    assert dead == ["invalid-id", "invalid-id"]
