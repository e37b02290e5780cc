# SPDX-License-Identifier: MIT
"""The in-process store, for tests and the demo."""

from __future__ import annotations

from onceonly.stores.memory._store import MemoryStore

__all__ = [
    "MemoryStore",
]
