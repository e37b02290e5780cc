# SPDX-License-Identifier: MIT
"""Shared helpers of the Kafka attack reproducers: a private database, a topic, and a
plain reader of a dead-letter topic. Public APIs only (confluent-kafka, psycopg)."""
from __future__ import annotations

import os
import socket
import time
import uuid

import pytest

BOOTSTRAP = os.environ.get("ONCEONLY_TEST_KAFKA", "127.0.0.1:9092")
PG = os.environ.get("ONCEONLY_ATTACK_PG", "postgresql://postgres@127.0.0.1:5432")
FAST = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}


def _reachable(hostport: str) -> bool:
    host, port = hostport.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except OSError:
        return False


def require_services() -> None:
    pytest.importorskip("confluent_kafka")
    pytest.importorskip("psycopg")
    if not _reachable(BOOTSTRAP):
        pytest.skip(f"no Kafka at {BOOTSTRAP}")
    if not _reachable(PG.rsplit("@", 1)[1].split("/")[0]):
        pytest.skip("no PostgreSQL")


def private_database():
    """Create a database of its own; return (url, drop)."""
    import psycopg

    name = "attack_" + uuid.uuid4().hex[:10]
    with psycopg.connect(PG + "/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")

    def drop() -> None:
        with psycopg.connect(PG + "/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    return f"{PG}/{name}", drop


def create_topic(topic: str, partitions: int = 1) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(15)


def produce(topic: str, records: list[dict]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": BOOTSTRAP})
    for record in records:
        producer.produce(topic, **record)
    assert producer.flush(15) == 0


def read_all(topic: str, seconds: float = 8.0) -> list:
    """Every record of ``topic`` (from the start) seen within ``seconds``."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "attack-read-" + uuid.uuid4().hex,
                         "auto.offset.reset": "earliest", **FAST})
    consumer.subscribe([topic])
    out = []
    end = time.time() + seconds
    try:
        while time.time() < end:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            out.append(msg)
    finally:
        consumer.close()
    return out
