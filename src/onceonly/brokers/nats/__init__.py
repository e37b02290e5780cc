# SPDX-License-Identifier: MIT
"""NATS JetStream (through nats-py): an outbox publisher and an inbox consumer.

The consumer and publisher live in this package's private modules; import them from here.
"""

from __future__ import annotations

from onceonly._core.deadletter import HEADER_SOURCE
from onceonly.brokers.nats._consumer import NatsConsumer
from onceonly.brokers.nats._publisher import NatsPublisher
from onceonly.brokers.nats._wire import MSG_ID_HEADER

__all__ = [
    "HEADER_SOURCE",
    "MSG_ID_HEADER",
    "NatsConsumer",
    "NatsPublisher",
]
