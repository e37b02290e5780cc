# SPDX-License-Identifier: MIT
"""Kafka consumer: the dead-letter copy of an undecodable record is the same record.

docs/brokers.md: the copy in ``<topic>.dead`` carries the ``onceonly-*`` headers and,
when known, ``onceonly-message-id``, with its key and value. An undecodable record's id
is known from its own header; a tombstone (null value) stays null, not ``b""`` (a
compacted topic treats only null as a delete).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

import onceonly
from tests.brokers._kits import kafka_read_all
from tests.brokers.test_kafka import Env

pytestmark = pytest.mark.timeout(90)


async def test_dead_letter_of_undecodable_record_keeps_its_id_and_null_value() -> None:
    env = Env(partitions=1)
    await env.start()
    run = uuid.uuid4().hex[:8]
    try:
        for key, value in ((b"tomb", None), (b"junk", b"\x00not json"), (b"z", b'{"id": "z"}')):
            env.producer.produce(
                env.topic,
                key=key,
                value=value,
                headers=[("onceonly-message-id", f"{run}-{key.decode()}".encode())],
            )
        await asyncio.to_thread(env.producer.flush, 10)
        inbox = onceonly.AsyncInbox(env.store, consumer="billing")
        seen = asyncio.Event()

        async def handler(msg: Any, tx: Any) -> None:
            seen.set()

        async with env.consumer(inbox, handler):
            await asyncio.wait_for(seen.wait(), 60)
            await asyncio.sleep(1)
        dead = {m.key(): m for m in await asyncio.to_thread(kafka_read_all, env.topic + ".dead")}
        assert set(dead) == {b"tomb", b"junk"}
        for key in (b"tomb", b"junk"):
            headers = dict(dead[key].headers() or [])
            assert headers.get("onceonly-dead-reason") == b"undecodable"
            assert headers.get("onceonly-message-id") == f"{run}-{key.decode()}".encode(), headers
        assert dead[b"tomb"].value() is None
        assert dead[b"junk"].value() == b"\x00not json"
    finally:
        await env.close()
