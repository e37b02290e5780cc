# SPDX-License-Identifier: MIT
"""A Redis (or in-process) tier in front of a durable store."""

from __future__ import annotations

from onceonly.stores.tiered._store import RedisTier, TieredStore
from onceonly.stores.tiered._store_async import AsyncRedisTier, AsyncTieredStore
from onceonly.stores.tiered._tiers import LocalTier

__all__ = [
    "AsyncRedisTier",
    "AsyncTieredStore",
    "LocalTier",
    "RedisTier",
    "TieredStore",
]
