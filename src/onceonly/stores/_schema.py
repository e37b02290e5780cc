# SPDX-License-Identifier: MIT
"""What the SQL stores' schema statements share (no I/O): the rows of
``onceonly_schema`` that say a store's tables are current, and their rendering as plain
SQL for a migration tool (Alembic offline mode prints statements, it binds nothing)."""

from __future__ import annotations

from onceonly.stores._outbox_sql import SCHEMA_VERSION as OUTBOX_SCHEMA_VERSION

__all__ = ["bind_literals", "drop_version_rows", "version_rows"]


def version_rows(table: str, outbox_table: str | None, version: int) -> list[tuple[str, int]]:
    """The ``(component, version)`` rows ``migrate()`` records: the records table at
    ``version`` and the outbox table, if any, at its own."""
    rows = [(f"records:{table}", version)]
    if outbox_table is not None:
        rows.append((f"outbox:{outbox_table}", OUTBOX_SCHEMA_VERSION))
    return rows


def bind_literals(statement: str, placeholder: str, *values: str | int) -> str:
    """``statement`` with its placeholders replaced by literals (identifiers and ints only:
    names were validated, so no quoting is needed beyond the quotes)."""
    parts = statement.split(placeholder)
    if len(parts) != len(values) + 1:
        raise ValueError(f"{len(parts) - 1} placeholders for {len(values)} values")
    out = parts[0]
    for value, part in zip(values, parts[1:], strict=True):
        out += (str(value) if isinstance(value, int) else f"'{value}'") + part
    return out


def drop_version_rows(rows: list[tuple[str, int]]) -> str:
    """Delete ``rows`` from ``onceonly_schema`` (the table stays: other tables' rows may
    be in it)."""
    components = ", ".join(f"'{component}'" for component, _ in rows)
    return f"DELETE FROM onceonly_schema WHERE component IN ({components})"
