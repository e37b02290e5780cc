# SPDX-License-Identifier: MIT
"""The stores: where records (and outbox rows) live.

``open_store``/``open_async_store`` pick one from a URL. Each backend is a package
(``memory``, ``sqlite``, ``postgres``, ``mysql``, ``redis``, ``tiered``) that owns its
connections, its SQL and its admin side; ``sqlite`` and ``memory`` need nothing else, the
others import their driver from their extra. This package imports none of them.
"""

from __future__ import annotations

from onceonly.stores._engine_pool import EngineConnections
from onceonly.stores._engine_pool_async import AsyncEngineConnections
from onceonly.stores._open import open_async_store, open_store
from onceonly.stores._threaded import ThreadedAsyncStore

__all__ = [
    "AsyncEngineConnections",
    "EngineConnections",
    "ThreadedAsyncStore",
    "open_async_store",
    "open_store",
]
