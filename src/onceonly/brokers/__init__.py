# SPDX-License-Identifier: MIT
"""Broker adapters: outbox publishers and inbox consumers.

Each broker is a package (``kafka``, ``nats``, ``rabbitmq``, ``redis_streams``, ``sqs``)
that imports its client at the top, so importing ``onceonly.brokers.rabbitmq`` without
the ``rabbitmq`` extra fails with an ImportError naming the extra. This package imports
none of them; it exports what every consumer shares (:class:`MessageIds`) and the
in-process broker for tests (also exported by :mod:`onceonly.testing`).
"""

from onceonly.brokers._ids import MessageIds
from onceonly.brokers._memory import DeadLetter, MemoryBroker, MemoryConsumer, MemoryMessage

__all__ = ["DeadLetter", "MemoryBroker", "MemoryConsumer", "MemoryMessage", "MessageIds"]
