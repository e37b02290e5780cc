# SPDX-License-Identifier: MIT
"""The dead-letter copy of an undecodable record loses what it carried.

docs/brokers.md: the copy in ``<topic>.dead`` carries the ``onceonly-*`` headers "and,
when known, ``onceonly-message-id``", with "its key and value". For a record whose body
cannot be decoded the id is known (its own ``onceonly-message-id`` header), yet the copy
has none; and a tombstone (null value) comes back as an empty value ``b""``, which is
not the same record (a compacted topic treats only null as a delete).
"""
from __future__ import annotations

import asyncio
import time
import uuid

from ._kafka_attack_util import BOOTSTRAP, FAST, create_topic, private_database, produce, read_all, require_services


def test_dead_letter_of_undecodable_record_keeps_its_id_and_null_value():
    require_services()
    import onceonly
    from onceonly.brokers.kafka import KafkaConsumer

    db, drop = private_database()
    run = uuid.uuid4().hex[:8]
    topic = f"attack-dlfid-{run}"

    async def main():
        create_topic(topic, 1)
        produce(topic, [
            dict(value=None, key=b"tomb", headers=[("onceonly-message-id", f"{run}-tomb".encode())]),
            dict(value=b"\x00not json", key=b"junk", headers=[("onceonly-message-id", f"{run}-junk".encode())]),
            dict(value=b'{"last": true}', key=b"z", headers=[("onceonly-message-id", f"{run}-last".encode())]),
        ])
        store = onceonly.open_async_store(db)
        await store.migrate()
        inbox = onceonly.AsyncInbox(store, consumer="billing")
        seen = asyncio.Event()

        async def handler(msg, tx):
            seen.set()

        async with KafkaConsumer(inbox, handler, topics=[topic], group=f"attack-dlfid-{run}",
                                 bootstrap=BOOTSTRAP, config=FAST):
            await asyncio.wait_for(seen.wait(), 60)
            await asyncio.sleep(1)
        await store.close()

    try:
        asyncio.run(main())
        dead = {m.key(): m for m in read_all(topic + ".dead")}
        assert set(dead) == {b"tomb", b"junk"}
        for key in (b"tomb", b"junk"):
            headers = dict(dead[key].headers() or [])
            assert headers.get("onceonly-dead-reason") == b"undecodable"
            assert headers.get("onceonly-message-id") == f"{run}-{key.decode()}".encode(), (key, headers)
        assert dead[b"tomb"].value() is None, dead[b"tomb"].value()
    finally:
        drop()
