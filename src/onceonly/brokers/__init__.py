# SPDX-License-Identifier: MIT
"""Broker adapters: outbox publishers and inbox consumers.

Each broker lives in its own module and imports its client at the top, so importing
``onceonly.brokers.rabbitmq`` without the ``rabbitmq`` extra fails with an ImportError
naming the extra. This package imports none of them; it exports what every consumer
shares (:class:`MessageIds`).
"""

from onceonly.brokers._ids import MessageIds

__all__ = ["MessageIds"]
