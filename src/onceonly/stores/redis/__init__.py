# SPDX-License-Identifier: MIT
"""The Redis store: one hash per record, each operation one Lua script.

Imports redis-py, from the ``redis`` extra.
"""

from __future__ import annotations

from onceonly.stores.redis._store import RedisStore
from onceonly.stores.redis._store_async import AsyncRedisStore

__all__ = [
    "AsyncRedisStore",
    "RedisStore",
]
