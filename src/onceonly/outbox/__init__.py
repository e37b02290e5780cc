# SPDX-License-Identifier: MIT
"""The transactional outbox and the relay that publishes its rows."""

from __future__ import annotations

from onceonly.outbox._outbox import Outbox, OutboxRow
from onceonly.outbox._outbox_async import AsyncOutbox
from onceonly.outbox._relay import Relay, RelayStats
from onceonly.outbox._relay_async import AsyncRelay

__all__ = [
    "AsyncOutbox",
    "AsyncRelay",
    "Outbox",
    "OutboxRow",
    "Relay",
    "RelayStats",
]
