# SPDX-License-Identifier: MIT
"""Kafka (through confluent-kafka): an outbox publisher and an inbox consumer whose
offsets can commit in the business transaction (docs/spec.md §4.9).

The consumer and publisher live in this package's private modules; import them from here.
"""

from __future__ import annotations

from onceonly.brokers.kafka._consumer import KafkaConsumer
from onceonly.brokers.kafka._positions import PartitionLost
from onceonly.brokers.kafka._publisher import KafkaPublisher

__all__ = [
    "KafkaConsumer",
    "KafkaPublisher",
    "PartitionLost",
]
