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

from typing import Any

from onceonly._core.sql import validate_identifier
from onceonly.errors import ConfigurationError
from onceonly.stores._outbox_sql import SCHEMA_VERSION as OUTBOX_SCHEMA_VERSION
from onceonly.stores._outbox_sql import OutboxSQL

__all__ = ["create_tables", "drop_statements", "drop_tables", "schema_statements"]


def _dialect(name: str) -> str:
    name = {"mariadb": "mysql"}.get(name, name)
    if name not in ("postgresql", "sqlite", "mysql"):
        raise ConfigurationError(
            f"no onceonly tables for the {name} dialect (PostgreSQL, SQLite, MariaDB/MySQL)"
        )
    return name


def _bound(statement: str, placeholder: str, *values: str | int) -> str:
    """``statement`` with its placeholders replaced by literals (identifiers and ints only:
    names were validated, so no quoting is needed beyond the quotes)."""
    parts = statement.split(placeholder)
    assert len(parts) == len(values) + 1
    out = parts[0]
    for value, part in zip(values, parts[1:], strict=True):
        out += (str(value) if isinstance(value, int) else f"'{value}'") + part
    return out


def _versions(dialect: str, table: str, outbox_table: str | None) -> list[tuple[str, int]]:
    if dialect == "sqlite":
        from onceonly.stores.sqlite._store import SCHEMA_VERSION
    elif dialect == "mysql":
        from onceonly.stores.mysql._sql import SCHEMA_VERSION
    else:
        from onceonly.stores.postgres._schema import SCHEMA_VERSION
    rows = [(f"records:{table}", SCHEMA_VERSION)]
    if outbox_table is not None:
        rows.append((f"outbox:{outbox_table}", OUTBOX_SCHEMA_VERSION))
    return rows


def schema_statements(
    dialect: str, *, table: str = "onceonly_records", outbox_table: str | None = "onceonly_outbox"
) -> list[str]:
    """The SQL of ``store.migrate()`` for ``dialect`` (``postgresql``, ``sqlite``,
    ``mysql`` or ``mariadb``), the version rows included, as plain statements.

    Raises:
        ConfigurationError: another dialect, or a bad table name.
    """
    dialect = _dialect(dialect)
    validate_identifier(table)
    if outbox_table is not None:
        validate_identifier(outbox_table)
    versions = _versions(dialect, table, outbox_table)
    if dialect == "sqlite":
        from onceonly.stores.sqlite._store import SCHEMA_UPSERT, schema_ddl

        return schema_ddl(table, outbox_table) + [_bound(SCHEMA_UPSERT, "?", *v) for v in versions]
    if dialect == "mysql":
        from onceonly.stores.mysql._sql import SCHEMA_DDL, records_ddl
        from onceonly.stores.mysql._sql import SCHEMA_UPSERT as MYSQL_UPSERT

        ddl = [SCHEMA_DDL, records_ddl(table)]
        if outbox_table is not None:
            ddl += OutboxSQL("mysql", outbox_table).migrate()
        return ddl + [_bound(MYSQL_UPSERT, "%s", *v) for v in versions]
    from onceonly.stores.postgres._sql import _records_ddl, schema_table_ddl, version_upsert

    pg = [schema_table_ddl().as_string(None)]
    pg += [ddl.as_string(None) for ddl in _records_ddl(table)]
    if outbox_table is not None:
        pg += OutboxSQL("postgresql", outbox_table).migrate()
    upsert = version_upsert().as_string(None)
    return pg + [_bound(upsert, "%s", *v) for v in versions]


def drop_statements(
    dialect: str, *, table: str = "onceonly_records", outbox_table: str | None = "onceonly_outbox"
) -> list[str]:
    """Undo :func:`schema_statements` (the ``onceonly_schema`` table stays: other
    tables' rows may be in it)."""
    dialect = _dialect(dialect)
    quote = "`" if dialect == "mysql" else '"'
    drops = [f"DROP TABLE IF EXISTS {quote}{validate_identifier(table)}{quote}"]
    if outbox_table is not None:
        drops += OutboxSQL(dialect, outbox_table).drop()
    components = ", ".join(
        f"'{component}'" for component, _ in _versions(dialect, table, outbox_table)
    )
    return [*drops, f"DELETE FROM onceonly_schema WHERE component IN ({components})"]


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
