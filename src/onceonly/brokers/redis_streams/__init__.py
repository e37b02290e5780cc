# SPDX-License-Identifier: MIT
"""Redis Streams (through redis-py's asyncio client): an outbox publisher and an inbox consumer.

The consumer and publisher live in this package's private modules; import them from here.
"""

from __future__ import annotations

from onceonly.brokers.redis_streams._consumer import RedisStreamsConsumer
from onceonly.brokers.redis_streams._publisher import RedisStreamsPublisher
from onceonly.brokers.redis_streams._wire import StreamEntry

__all__ = [
    "RedisStreamsConsumer",
    "RedisStreamsPublisher",
    "StreamEntry",
]
