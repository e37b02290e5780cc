# SPDX-License-Identifier: MIT
"""The Redis store: one hash per record, each operation one Lua script.

Besides the stores, what the Redis cache tier (:mod:`onceonly.stores.tiered`) shares with
them: ``record_key`` (the key layout) and ``redis_errors`` (the error translation).

Imports redis-py, from the ``redis`` extra.
"""

from __future__ import annotations

from onceonly.stores.redis._errors import redis_errors
from onceonly.stores.redis._lua import record_key
from onceonly.stores.redis._store import RedisStore
from onceonly.stores.redis._store_async import AsyncRedisStore

__all__ = [
    "AsyncRedisStore",
    "RedisStore",
    "record_key",
    "redis_errors",
]
