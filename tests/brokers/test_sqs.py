# SPDX-License-Identifier: MIT
"""What only SQS does: its publisher, visibility extension for long handlers, the
redrive policy. Against moto_server started as a real HTTP process (no SQS runs on
these machines; tests/brokers/_kits.py starts it); the shared behaviour is in
test_contract.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly.brokers.sqs import SqsConsumer, SqsPublisher
from onceonly.errors import PublishError
from onceonly.messaging import OutboxMessage
from tests.brokers._kits import SQS_OPTIONS, moto_endpoint

pytestmark = pytest.mark.timeout(40)


@pytest.fixture
async def sqs() -> AsyncIterator[Any]:
    from aiobotocore.session import get_session

    options = {**SQS_OPTIONS, "endpoint_url": moto_endpoint()}
    async with get_session().create_client("sqs", **options) as client:
        client.test_options = options
        yield client


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Any]:
    s = onceonly.open_async_store(f"sqlite:///{tmp_path}/x.db")
    await s.migrate()
    yield s
    await s.close()


async def queue(sqs: Any, **attributes: str) -> tuple[str, str]:
    name = f"sqs-{uuid.uuid4().hex[:12]}"
    url = (await sqs.create_queue(QueueName=name, Attributes=attributes))["QueueUrl"]
    return name, url


def consumer(sqs: Any, store: Any, handler: Any, name: str, **kw: Any) -> SqsConsumer:
    inbox = onceonly.AsyncInbox(store, consumer="sqs")
    kw.setdefault("retry_delay", 0.05)
    return SqsConsumer(inbox, handler, queue=name, **{**sqs.test_options, **kw})


async def test_publisher_sends_the_outbox_id_and_the_consumer_keys_on_it(
    sqs: Any, store: Any
) -> None:
    """publish returns once SQS replied; a re-publish of the row is one message to the
    inbox (the id travels as the onceonly-message-id attribute)."""
    name, url = await queue(sqs)
    row = OutboxMessage(id=str(uuid.uuid4()), topic=name, payload='{"n": 1}', key="acct-1")
    keys: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        keys.append(tx.key)

    async with SqsPublisher(**sqs.test_options) as pub:
        await pub.connect()
        await pub.publish(row)
        await pub.publish(row)  # the relay publishing the same row again
        with pytest.raises(PublishError):
            await pub.publish(OutboxMessage(id="x", topic=f"{name}-missing", payload="{}"))
    async with consumer(sqs, store, handler, name):
        for _ in range(200):
            if keys:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)
    assert keys == [row.id]
    attrs = await sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
    assert attrs["Attributes"]["ApproximateNumberOfMessages"] == "0"
    assert attrs["Attributes"]["ApproximateNumberOfMessagesNotVisible"] == "0"


async def test_a_long_handler_keeps_its_message_invisible(
    sqs: Any, store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler running 3.5 s on a 2 s visibility timeout is not received again: the
    loop extends the visibility while it runs."""
    from onceonly.brokers.sqs._transport import SqsTransport

    received: list[int | None] = []
    real_receive = SqsTransport.receive

    async def receive(self: SqsTransport, limit: int) -> Any:
        got = await real_receive(self, limit)
        received.extend(d.delivery_count for d in got)
        return got

    monkeypatch.setattr(SqsTransport, "receive", receive)
    name, url = await queue(sqs)
    done = asyncio.Event()

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        await asyncio.sleep(3.5)
        done.set()

    await sqs.send_message(QueueUrl=url, MessageBody="{}", MessageAttributes={})
    async with consumer(sqs, store, handler, name, visibility_timeout=2):
        await asyncio.wait_for(done.wait(), 15)
        await asyncio.sleep(0.5)
    assert received == [1]


async def test_dead_letters_go_to_the_redrive_target(
    sqs: Any, store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Without dead_letter=, the queue's redrive target receives onceonly's dead letters;
    a maxReceiveCount at or below max_deliveries is warned about."""
    target, target_url = await queue(sqs)
    arn = (await sqs.get_queue_attributes(QueueUrl=target_url, AttributeNames=["QueueArn"]))[
        "Attributes"
    ]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": "3"})
    name, url = await queue(sqs, RedrivePolicy=policy)

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> None:
        raise ValueError("bad")

    caplog.set_level("WARNING", logger="onceonly.brokers.sqs")
    await sqs.send_message(QueueUrl=url, MessageBody='{"n": 1}')
    c = consumer(sqs, store, handler, name, max_deliveries=1)
    dead: list[Any] = []
    async with c:
        assert c.dead_letter == target
        for _ in range(200):
            reply = await sqs.receive_message(
                QueueUrl=target_url, MessageAttributeNames=["All"], WaitTimeSeconds=0
            )
            dead += reply.get("Messages", [])
            if dead:
                break
            await asyncio.sleep(0.05)
    assert [m["Body"] for m in dead] == ['{"n": 1}']
    attrs = dead[0]["MessageAttributes"]
    assert attrs["onceonly-dead-reason"]["StringValue"] == "max-deliveries"
    assert attrs["onceonly-source"]["StringValue"] == name
    assert "redrive policy" not in caplog.text  # 3 receives > max_deliveries (1)
    with contextlib.suppress(Exception):
        await sqs.delete_queue(QueueUrl=url)
        await sqs.delete_queue(QueueUrl=target_url)
