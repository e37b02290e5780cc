# SPDX-License-Identifier: MIT
"""Kafka: the dedup window against a topic's retention (``retention.ms``).

A consumer group reads a record again for as long as the topic keeps it (a lost
position, an offset reset), so an inbox ttl shorter than the retention lets such a read
run the handler again. The consumer checks it at start (``dedup_window``), and
``onceonly doctor --broker kafka://… --topic …`` from outside. Tansu reports
``retention.ms`` only for a topic created with one: for the others the check says
*unknown*, never that the ttl covers it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly.brokers.kafka import KafkaConsumer
from tests.brokers._kits import KAFKA_BOOTSTRAP, KAFKA_FAST_JOIN
from tests.conftest import unavailable

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]
HOUR_MS = "3600000"


async def _topic(retention_ms: str | None) -> str:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    name = f"kafka-ret-{uuid.uuid4().hex[:10]}"
    config = {"retention.ms": retention_ms} if retention_ms is not None else {}

    def create() -> None:
        admin = AdminClient({"bootstrap.servers": KAFKA_BOOTSTRAP})
        for future in admin.create_topics([NewTopic(name, 1, config=config)]).values():
            future.result(10)

    try:
        await asyncio.to_thread(create)
    except Exception:
        unavailable(f"Kafka (Tansu) at {KAFKA_BOOTSTRAP}")
    return name


@pytest.fixture
async def inbox(tmp_path: Path) -> AsyncIterator[onceonly.AsyncInbox]:
    store = onceonly.open_async_store(f"sqlite:///{tmp_path / 'inbox.db'}")
    await store.migrate()
    try:
        yield onceonly.AsyncInbox(store, consumer="c", ttl=60)
    finally:
        await store.close()


def _consumer(inbox: onceonly.AsyncInbox, topic: str, dedup_window: str) -> KafkaConsumer:
    return KafkaConsumer(
        inbox,
        _nothing,
        topics=[topic],
        group=f"g-{topic}",
        bootstrap=KAFKA_BOOTSTRAP,
        config=KAFKA_FAST_JOIN,
        dedup_window=dedup_window,
    )


async def _nothing(payload: Any, tx: onceonly.AsyncTx) -> None:
    return None


async def test_a_ttl_shorter_than_the_retention_is_refused_at_start(
    inbox: onceonly.AsyncInbox,
) -> None:
    """retention.ms of 1 h, inbox ttl of 60 s: dedup_window="refuse" does not start."""
    topic = await _topic(HOUR_MS)
    with pytest.raises(onceonly.ConfigurationError, match=r"retention\.ms: 3600 s"):
        async with _consumer(inbox, topic, "refuse"):
            pass


async def test_a_ttl_shorter_than_the_retention_is_warned_about(
    inbox: onceonly.AsyncInbox, caplog: pytest.LogCaptureFixture
) -> None:
    topic = await _topic(HOUR_MS)
    caplog.set_level(logging.WARNING, logger="onceonly.brokers.kafka")
    async with _consumer(inbox, topic, "warn"):
        pass
    warned = [r.getMessage() for r in caplog.records if "redelivery horizon" in r.getMessage()]
    assert len(warned) == 1 and f"topic {topic} retention.ms" in warned[0], warned


async def test_an_unreported_retention_is_unknown_not_covered(
    inbox: onceonly.AsyncInbox, caplog: pytest.LogCaptureFixture
) -> None:
    """A topic created without retention.ms: Tansu reports none. The consumer says the
    window is unknown (and still starts, also with "refuse": nothing shows a problem)."""
    topic = await _topic(None)
    caplog.set_level(logging.WARNING, logger="onceonly.brokers.kafka")
    async with _consumer(inbox, topic, "refuse"):
        pass
    said = [r.getMessage() for r in caplog.records if "unknown" in r.getMessage()]
    assert len(said) == 1 and repr(topic) in said[0] and "retention.ms" in said[0], said


async def test_dedup_window_off_reads_nothing(
    inbox: onceonly.AsyncInbox, caplog: pytest.LogCaptureFixture
) -> None:
    topic = await _topic(HOUR_MS)
    caplog.set_level(logging.WARNING, logger="onceonly.brokers.kafka")
    async with _consumer(inbox, topic, "off"):
        pass
    assert not [r for r in caplog.records if "retention" in r.getMessage()]


def _doctor(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    url = f"sqlite:///{tmp_path / 'd.db'}"
    store = onceonly.open_store(url)
    store.migrate()
    store.close()
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    return subprocess.run(
        [sys.executable, "-m", "onceonly", "doctor", "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


async def test_doctor_reads_the_topics_retention(tmp_path: Path) -> None:
    """``onceonly doctor --broker kafka://… --topic …``: a ttl below retention.ms fails,
    one above passes, an unreported retention is a finding that says unknown."""
    hour, silent = await _topic(HOUR_MS), await _topic(None)
    broker = ("--broker", f"kafka://{KAFKA_BOOTSTRAP}")
    short = await asyncio.to_thread(_doctor, tmp_path, *broker, "--topic", hour, "--ttl", "60s")
    assert short.returncode == 1, short.stdout + short.stderr
    assert "FAIL  kafka: the inbox ttl (60 s) is shorter" in short.stdout
    assert f"topic {hour} retention.ms: 3600 s" in short.stdout
    long = await asyncio.to_thread(_doctor, tmp_path, *broker, "--topic", hour, "--ttl", "2h")
    assert long.returncode == 0, long.stdout + long.stderr
    assert f"ok    kafka: the inbox ttl covers topic {hour} retention.ms" in long.stdout
    unknown = await asyncio.to_thread(_doctor, tmp_path, *broker, "--topic", silent)
    assert unknown.returncode == 1, unknown.stdout + unknown.stderr
    assert f"FAIL  kafka: the retention of topic {silent} is unknown" in unknown.stdout
    missing = await asyncio.to_thread(_doctor, tmp_path, *broker)
    assert missing.returncode == 1 and "without --topic" in missing.stdout
