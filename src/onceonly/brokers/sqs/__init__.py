# SPDX-License-Identifier: MIT
"""Amazon SQS (through aiobotocore): an outbox publisher and an inbox consumer.

The consumer and publisher live in this package's private modules; import them from here.
"""

from __future__ import annotations

from onceonly.brokers.sqs._consumer import SqsConsumer
from onceonly.brokers.sqs._publisher import SqsPublisher

__all__ = [
    "SqsConsumer",
    "SqsPublisher",
]
