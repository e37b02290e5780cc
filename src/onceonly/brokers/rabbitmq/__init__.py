# SPDX-License-Identifier: MIT
"""RabbitMQ (AMQP 0-9-1, through aio-pika): an outbox publisher and an inbox consumer.

The consumer and publisher live in this package's private modules; import them from here.
"""

from __future__ import annotations

from onceonly.brokers.rabbitmq._consumer import RabbitMQConsumer
from onceonly.brokers.rabbitmq._publisher import RabbitMQPublisher

__all__ = [
    "RabbitMQConsumer",
    "RabbitMQPublisher",
]
