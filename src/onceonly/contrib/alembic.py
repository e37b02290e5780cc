# SPDX-License-Identifier: MIT
"""The records and outbox tables as an Alembic migration (``onceonly[alembic]``).

In a revision of your own::

    from onceonly.contrib.alembic import create_tables, drop_tables

    def upgrade() -> None:
        create_tables(op)

    def downgrade() -> None:
        drop_tables(op)

The statements are the ones ``store.migrate()`` runs (the same source, rendered for the
migration's dialect: PostgreSQL, SQLite or MariaDB/MySQL), including the rows of the
``onceonly_schema`` table that tell a store its tables are current. They are plain SQL,
so ``alembic upgrade --sql`` (offline mode) prints them too. The PostgreSQL statements
are rendered with psycopg 3 (``onceonly[postgres]``); the records table is the plain
layout (a time-partitioned one is made by ``store.migrate(partitioned=True)``).

.. versionadded:: 0.3
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from onceonly.errors import ConfigurationError

__all__ = ["create_tables", "drop_statements", "drop_tables", "schema_statements"]

Render = Callable[[str, "str | None"], list[str]]


def _backend(dialect: str) -> tuple[Render, Render]:
    """The ``schema_statements`` and ``drop_statements`` of the store package whose
    database ``dialect`` is (its public face)."""
    if dialect == "sqlite":
        from onceonly.stores import sqlite

        return sqlite.schema_statements, sqlite.drop_statements
    if dialect == "postgresql":
        from onceonly.stores import postgres

        return postgres.schema_statements, postgres.drop_statements
    if dialect in ("mysql", "mariadb"):
        from onceonly.stores import mysql

        return mysql.schema_statements, mysql.drop_statements
    raise ConfigurationError(
        f"no onceonly tables for the {dialect} dialect (PostgreSQL, SQLite, MariaDB/MySQL)"
    )


def schema_statements(
    dialect: str, *, table: str = "onceonly_records", outbox_table: str | None = "onceonly_outbox"
) -> list[str]:
    """The SQL of ``store.migrate()`` for ``dialect`` (``postgresql``, ``sqlite``,
    ``mysql`` or ``mariadb``), the version rows included, as plain statements.

    Raises:
        ConfigurationError: another dialect, or a bad table name.
    """
    return _backend(dialect)[0](table, outbox_table)


def drop_statements(
    dialect: str, *, table: str = "onceonly_records", outbox_table: str | None = "onceonly_outbox"
) -> list[str]:
    """Undo :func:`schema_statements` (the ``onceonly_schema`` table stays: other
    tables' rows may be in it)."""
    return _backend(dialect)[1](table, outbox_table)


def _run(op: Any, statements: list[str]) -> None:
    from sqlalchemy import text

    for statement in statements:
        # text() reads ":name" as a parameter; the statements have none (a literal
        # 'records:t' would look like one), so every colon is escaped
        op.execute(text(statement.replace(":", "\\:")))


def create_tables(
    op: Any, *, table: str = "onceonly_records", outbox_table: str | None = "onceonly_outbox"
) -> None:
    """Create the records and outbox tables in an Alembic ``upgrade()``.

    Args:
        op: ``alembic.op``.
        table: the records table (the store's ``table=``).
        outbox_table: the outbox table (``None``: none).
    """
    _run(
        op, schema_statements(op.get_context().dialect.name, table=table, outbox_table=outbox_table)
    )


def drop_tables(
    op: Any, *, table: str = "onceonly_records", outbox_table: str | None = "onceonly_outbox"
) -> None:
    """Drop what :func:`create_tables` created, in an Alembic ``downgrade()``."""
    dialect = op.get_context().dialect.name
    _run(op, drop_statements(dialect, table=table, outbox_table=outbox_table))
