# SPDX-License-Identifier: MIT
"""aiomysql specifics of the async MariaDB/MySQL store (the sync twin has none)."""

from __future__ import annotations

from typing import Any

import aiomysql

__all__ = ["QuietCursor"]


class QuietCursor(aiomysql.Cursor):  # type: ignore[misc]
    """aiomysql's cursor without its ``SHOW WARNINGS`` round trip after a statement that
    left a server note (``CREATE TABLE IF NOT EXISTS`` on an existing table, …), which it
    would raise as Python warnings. PyMySQL does not do it either."""

    async def _show_warnings(self, conn: Any) -> None:
        return None
