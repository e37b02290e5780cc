# SPDX-License-Identifier: MIT
"""Operating the records: retention, the reaper, redrive, stats and duplicate counts."""

from __future__ import annotations

from onceonly.admin._admin import Admin, admin_store
from onceonly.admin._admin_async import AsyncAdmin, admin_store_async
from onceonly.admin._common import (
    DuplicateCounter,
    DuplicatePoint,
    DuplicateRecorder,
    LatenessReport,
    PurgeReport,
    ReapReport,
    StatsReport,
)

__all__ = [
    "Admin",
    "AsyncAdmin",
    "DuplicateCounter",
    "DuplicatePoint",
    "DuplicateRecorder",
    "LatenessReport",
    "PurgeReport",
    "ReapReport",
    "StatsReport",
    "admin_store",
    "admin_store_async",
]
