# SPDX-License-Identifier: MIT
"""The relay tells transient from permanent publish failures (docs/spec.md §4.7).

A broker that cannot be reached never makes a row dead and never consumes an attempt,
however long the outage; a broker that refuses the message counts towards
``max_attempts``. Here the broker is an in-process publisher that is "down" on demand;
tests/outbox/test_relay_outage.py stops and restarts real brokers.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import onceonly
from onceonly._core.publishing import is_transient
from onceonly.messaging import OutboxMessage


class FlakyPublisher:
    """Down (BrokerUnavailable) while ``down`` is set; refuses topics in ``refuse``."""

    def __init__(self, refuse: tuple[str, ...] = ()) -> None:
        self.down = True
        self.refuse = refuse
        self.sent: list[OutboxMessage] = []
        self.calls = 0

    def publish(self, message: OutboxMessage) -> None:
        self.calls += 1
        if self.down:
            raise onceonly.BrokerUnavailable("connection refused", key=message.id)
        if message.topic in self.refuse:
            raise onceonly.PublishError("unroutable", key=message.id)
        self.sent.append(message)

    def close(self) -> None:
        pass


def _rows(store: Any, n: int, topic: str = "orders") -> None:
    outbox = onceonly.Outbox(store)
    with store.transaction() as tx:
        for i in range(n):
            outbox.publish(tx.connection, topic, {"n": i})


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (onceonly.BrokerUnavailable("down"), True),
        (onceonly.PublishError("unroutable"), False),
        (ConnectionResetError(), True),
        (OSError("network unreachable"), True),
        (TimeoutError(), True),
        (asyncio.TimeoutError(), True),
        (ValueError("a bug in a publisher"), False),
    ],
)
def test_classification(exc: BaseException, transient: bool) -> None:
    """The pure table of _core/publishing.py."""
    assert is_transient(exc) is transient


def test_an_outage_longer_than_every_backoff_kills_no_row(sql_store: Any) -> None:
    """Many failed rounds while the broker is down: 0 attempts, 0 dead; then all go."""
    _rows(sql_store, 5)
    pub = FlakyPublisher()
    relay = onceonly.Relay(sql_store, pub, max_attempts=2, backoff_base=0.0, backoff_cap=0.0)
    outbox = onceonly.Outbox(sql_store)
    for _ in range(10):  # five times the attempt budget
        stats = relay.run_once()
        assert stats.postponed == 5 and stats.failed == 0 and stats.dead == 0
    assert outbox.counts() == {"pending": 5, "dead": 0}
    assert all(r.message.attempts == 0 for r in outbox.rows("pending"))
    assert "connection refused" in (outbox.rows("pending")[0].last_error or "")
    pub.down = False
    assert relay.run_once().published == 5
    assert outbox.counts() == {"pending": 0, "dead": 0}
    assert sorted(m.decoded()["n"] for m in pub.sent) == list(range(5))


def test_permanent_failures_still_count_and_go_dead(sql_store: Any) -> None:
    """A refused message is counted; at max_attempts it is dead, beside rows that go."""
    _rows(sql_store, 2, topic="orders")
    _rows(sql_store, 1, topic="nowhere")
    pub = FlakyPublisher(refuse=("nowhere",))
    pub.down = False
    relay = onceonly.Relay(sql_store, pub, max_attempts=2, backoff_base=0.0, backoff_cap=0.0)
    first = relay.run_once()
    assert (first.published, first.failed, first.dead) == (2, 1, 0)
    second = relay.run_once()
    assert (second.published, second.failed, second.dead) == (0, 0, 1)
    [dead] = onceonly.Outbox(sql_store).rows("dead")
    assert dead.message.topic == "nowhere" and dead.message.attempts == 2
    assert "unroutable" in (dead.last_error or "")


def test_postponed_rows_wait_their_backoff(sql_store: Any) -> None:
    """A postponed row is not claimed again before its backoff runs out."""
    _rows(sql_store, 1)
    pub = FlakyPublisher()
    relay = onceonly.Relay(sql_store, pub, backoff_base=30.0, backoff_cap=60.0)
    assert relay.run_once().postponed == 1
    calls = pub.calls
    pub.down = False
    assert relay.run_once().published == 0  # still waiting
    assert pub.calls == calls


def test_one_warning_per_outage_and_one_line_on_recovery(
    sql_store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An outage logs one warning when it begins and one info line when it ends."""
    _rows(sql_store, 3)
    pub = FlakyPublisher()
    relay = onceonly.Relay(sql_store, pub, backoff_base=0.0, backoff_cap=0.0)
    with caplog.at_level(logging.DEBUG, logger="onceonly.relay"):
        for _ in range(4):
            relay.run_once()
        pub.down = False
        relay.run_once()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "broker is unavailable" in warnings[0].getMessage()
    assert any("broker is back" in r.getMessage() for r in caplog.records)


def test_refused_publish_is_logged_with_row_id_and_topic(
    sql_store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Each refused publish is a warning naming the row and its topic (not the payload)."""
    _rows(sql_store, 1, topic="nowhere")
    pub = FlakyPublisher(refuse=("nowhere",))
    pub.down = False
    [row] = onceonly.Outbox(sql_store).rows("pending")
    with caplog.at_level(logging.WARNING, logger="onceonly.relay"):
        onceonly.Relay(sql_store, pub, max_attempts=5).run_once()
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert row.message.id in warning and "nowhere" in warning and "unroutable" in warning


class ConnectingPublisher(FlakyPublisher):
    def connect(self) -> None:
        raise onceonly.BrokerUnavailable("authentication failed")


def test_run_checks_the_broker_at_start(sql_store: Any) -> None:
    """run() connects first: a publisher that cannot connect ends it at once."""
    relay = onceonly.Relay(sql_store, ConnectingPublisher())
    with pytest.raises(onceonly.BrokerUnavailable, match="authentication failed"):
        relay.run()
