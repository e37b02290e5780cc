# SPDX-License-Identifier: MIT
"""An SQS consumer with a leased inbox on Redis (docs/spec.md §1.4a, §4.6): the loop
renews the lease and extends the visibility together, and a delivery whose lease was
taken over is neither extended nor acked. Against moto_server started as a real HTTP
process (no SQS runs on these machines; tests/brokers/_kits.py starts it) and the real
Redis."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

import onceonly
from onceonly.brokers.sqs import SqsConsumer
from onceonly.brokers.sqs._transport import SqsTransport
from onceonly.stores.redis._lua import record_key
from tests.brokers._kits import SQS_OPTIONS, moto_endpoint
from tests.conftest import REDIS_URL, drop_redis_prefix, require_redis, unique_table

pytestmark = pytest.mark.timeout(40)


@pytest.fixture
async def sqs() -> AsyncIterator[Any]:
    from aiobotocore.session import get_session

    options = {**SQS_OPTIONS, "endpoint_url": moto_endpoint()}
    async with get_session().create_client("sqs", **options) as client:
        client.test_options = options
        yield client


@pytest.fixture
async def redis_store() -> AsyncIterator[Any]:
    require_redis()
    prefix = f"{unique_table()}:"
    store = onceonly.open_async_store(REDIS_URL, prefix=prefix)
    yield store
    await store.close()
    drop_redis_prefix(prefix)


async def queue(sqs: Any) -> tuple[str, str]:
    name = f"sqs-leased-{uuid.uuid4().hex[:10]}"
    return name, (await sqs.create_queue(QueueName=name))["QueueUrl"]


def message_id(value: str) -> dict[str, Any]:
    return {"onceonly-message-id": {"DataType": "String", "StringValue": value}}


async def left_in(sqs: Any, url: str) -> int:
    reply = await sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
    a = reply["Attributes"]
    return int(a["ApproximateNumberOfMessages"]) + int(a["ApproximateNumberOfMessagesNotVisible"])


async def test_a_long_handler_keeps_its_lease_and_its_message(
    sqs: Any, redis_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler of 2.6 s, on a 2 s visibility timeout and a 0.4 s lease, is not
    redelivered, and a duplicate sent meanwhile neither takes it over nor runs: it waits
    (in flight) and replays. Both are acked."""
    received: list[int | None] = []
    real_receive = SqsTransport.receive

    async def receive(self: SqsTransport, limit: int) -> Any:
        got = await real_receive(self, limit)
        received.extend(d.delivery_count for d in got)
        return got

    monkeypatch.setattr(SqsTransport, "receive", receive)
    name, url = await queue(sqs)
    inbox = onceonly.AsyncInbox(redis_store, consumer="sqs", lease=0.4)
    assert inbox.mode == "leased"
    runs: list[int] = []
    started = asyncio.Event()

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> str:
        runs.append(tx.attempt)
        started.set()
        await asyncio.sleep(2.6)
        return "charged"

    await sqs.send_message(QueueUrl=url, MessageBody="{}", MessageAttributes=message_id("o-1"))
    async with SqsConsumer(
        inbox, handler, queue=name, visibility_timeout=2, retry_delay=0.05, **sqs.test_options
    ):
        await asyncio.wait_for(started.wait(), 10)
        await asyncio.sleep(0.8)  # two leases: only renewals keep the claim
        await sqs.send_message(QueueUrl=url, MessageBody="{}", MessageAttributes=message_id("o-1"))
        for _ in range(100):
            if await left_in(sqs, url) == 0:
                break
            await asyncio.sleep(0.1)
    assert runs == [1]
    assert received == [1, 1]  # two messages, neither received twice
    assert await left_in(sqs, url) == 0


async def test_a_lease_taken_over_is_not_extended_nor_acked(
    sqs: Any, redis_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mid-handler, another worker takes the claim over (its token overwritten in
    Redis): the loop stops extending the message's visibility, the run ends in
    LeaseLost, and the message is handed back (received again), never deleted."""
    import redis.asyncio as aredis

    extended: list[tuple[float, list[str]]] = []
    real_extend = SqsTransport.extend

    async def extend(self: SqsTransport, ds: Any) -> None:
        extended.append((time.monotonic(), [d.raw["ReceiptHandle"] for d in ds]))
        await real_extend(self, ds)

    settled: list[tuple[str, str]] = []
    real_ack, real_retry = SqsTransport.ack, SqsTransport.retry

    async def ack(self: SqsTransport, d: Any) -> None:
        settled.append(("ack", d.raw["ReceiptHandle"]))
        await real_ack(self, d)

    async def retry(self: SqsTransport, d: Any, delay: float) -> None:
        settled.append(("retry", d.raw["ReceiptHandle"]))
        await real_retry(self, d, delay)

    monkeypatch.setattr(SqsTransport, "extend", extend)
    monkeypatch.setattr(SqsTransport, "ack", ack)
    monkeypatch.setattr(SqsTransport, "retry", retry)
    name, url = await queue(sqs)
    # the taker-over's lease (5 s from the claim) outlives the test: no one completes
    inbox = onceonly.AsyncInbox(redis_store, consumer="sqs", lease=5, wait=0.2)
    fenced = asyncio.Event()
    ended = asyncio.Event()
    taken_at: list[float] = []
    handles: list[str] = []

    async def handler(payload: Any, tx: onceonly.AsyncTx) -> str:
        if fenced.is_set():  # the delivery handed back: the key is someone else's now
            return "late"
        async with aredis.Redis.from_url(REDIS_URL) as r:
            await r.hset(record_key(redis_store.prefix, tx.scope, tx.key), "token", "4242")
        taken_at.append(time.monotonic())
        handles.append(tx.delivery.raw["ReceiptHandle"] if tx.delivery else "")
        fenced.set()
        await asyncio.sleep(1.5)  # over four extension periods
        taken_at.append(time.monotonic())
        ended.set()
        return "discarded"

    await sqs.send_message(QueueUrl=url, MessageBody="{}", MessageAttributes=message_id("o-2"))
    async with SqsConsumer(
        inbox, handler, queue=name, visibility_timeout=1, retry_delay=0.05, wait_time=0,
        **sqs.test_options,
    ):  # fmt: skip
        await asyncio.wait_for(ended.wait(), 10)
        await asyncio.sleep(0.3)  # settled: handed back, not acked
    # from the takeover (and one period to notice it) to the handler's end, the delivery
    # was not extended (its redelivery, waiting in flight, may be)
    start, end = taken_at[0] + 0.4, taken_at[1]
    late = [hs for t, hs in extended if start < t < end]
    assert late and not any(handles[0] in hs for hs in late), extended
    assert ("retry", handles[0]) in settled  # handed back (lease-lost)
    assert not [h for how, h in settled if how == "ack"], settled  # nothing acked
    reply = await sqs.receive_message(
        QueueUrl=url, WaitTimeSeconds=3, AttributeNames=["All"], VisibilityTimeout=5
    )
    again = reply.get("Messages", [])
    assert len(again) == 1  # still there: not deleted
    assert int(again[0]["Attributes"]["ApproximateReceiveCount"]) >= 2
