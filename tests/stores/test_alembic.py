# SPDX-License-Identifier: MIT
"""The Alembic recipe (``onceonly.contrib.alembic``): a real ``alembic upgrade`` creates
the tables ``store.migrate()`` would, a store uses them as current (schema version,
``onceonly doctor``'s schema check, a message processed and relayed), and ``downgrade``
removes them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, inspect

import onceonly
from onceonly.cli._checks import check_store
from onceonly.contrib.alembic import drop_statements, schema_statements
from onceonly.testing import ListPublisher
from tests.conftest import (
    MYSQL_URL,
    PG_URL,
    drop_mysql_table,
    drop_pg_table,
    require_mysql,
    require_postgres,
)

ENV = """
from alembic import context
from sqlalchemy import create_engine

config = context.config
engine = create_engine(config.get_main_option("sqlalchemy.url"))
with engine.connect() as connection:
    context.configure(
        connection=connection, version_table=config.get_main_option("version_table")
    )
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
"""

REVISION = """
from alembic import op

from onceonly.contrib.alembic import create_tables, drop_tables

revision = "0001"
down_revision = None


def upgrade():
    create_tables(op, table="{table}", outbox_table="{table}_ob")


def downgrade():
    drop_tables(op, table="{table}", outbox_table="{table}_ob")
"""


def _urls(kind: str, tmp_path: Path) -> tuple[str, str]:
    """(SQLAlchemy URL, store URL) of one database."""
    if kind == "sqlite":
        path = tmp_path / "alembic.db"
        return f"sqlite:///{path}", f"sqlite:///{path}"
    if kind == "postgres":
        require_postgres()
        return PG_URL.replace("postgresql://", "postgresql+psycopg://", 1), PG_URL
    require_mysql()
    return MYSQL_URL.replace("mysql://", "mysql+pymysql://", 1), MYSQL_URL


@pytest.fixture
def table(request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    kind = request.node.callspec.params["kind"]
    if kind == "postgres":
        drop_pg_table(name)
        drop_pg_table(f"{name}_ob")
        drop_pg_table(f"alembic_{name}")
    elif kind == "mysql":
        drop_mysql_table(name, f"{name}_ob", f"alembic_{name}")


def _config(tmp_path: Path, sa_url: str, table: str) -> Config:
    scripts = tmp_path / "migrations"
    (scripts / "versions").mkdir(parents=True)
    (scripts / "env.py").write_text(ENV)
    (scripts / "versions" / "0001_onceonly.py").write_text(REVISION.format(table=table))
    config = Config()
    config.set_main_option("script_location", str(scripts))
    config.set_main_option("sqlalchemy.url", sa_url)
    config.set_main_option("version_table", f"alembic_{table}")
    return config


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "mysql"])
def test_upgrade_makes_current_tables_and_downgrade_removes_them(
    kind: str, table: str, tmp_path: Path
) -> None:
    sa_url, url = _urls(kind, tmp_path)
    config = _config(tmp_path, sa_url, table)
    command.upgrade(config, "head")

    store = onceonly.open_store(url, table=table, outbox_table=f"{table}_ob")
    try:
        module = __import__(type(store).__module__, fromlist=["SCHEMA_VERSION"])
        assert store.schema_version() == module.SCHEMA_VERSION == 1  # type: ignore[attr-defined]
        [schema] = [f for f in check_store(store) if f.check == "schema"]
        assert schema.ok, schema
        inbox = onceonly.Inbox(store, consumer="c")

        def handler(payload: dict[str, Any], tx: onceonly.Tx) -> int:
            tx.publish("orders", payload)
            return 7

        assert inbox.process("m-1", {"n": 1}, handler).result == 7
        assert inbox.process("m-1", {"n": 1}, handler).replayed
        assert onceonly.Relay(store, ListPublisher()).run_once().published == 1
        store.migrate()  # the store's own migration finds everything in place
    finally:
        store.close()

    command.downgrade(config, "base")
    engine = create_engine(sa_url)
    try:
        names = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert not {table, f"{table}_ob"} & names
    store = onceonly.open_store(url, table=table, outbox_table=f"{table}_ob")
    try:
        assert store.schema_version() is None
    finally:
        store.close()


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite", "mysql", "mariadb"])
def test_statements_are_the_migrate_ones(dialect: str) -> None:
    """Offline (``alembic upgrade --sql``) the same statements are printed: plain SQL
    naming the tables, with the version rows; ``drop_statements`` names them too."""
    statements = schema_statements(dialect, table="t_x", outbox_table="t_x_ob")
    text = "\n".join(statements)
    assert "t_x" in text and "t_x_ob" in text and "'records:t_x'" in text
    assert all("?" not in s and "%s" not in s for s in statements)
    drops = "\n".join(drop_statements(dialect, table="t_x", outbox_table="t_x_ob"))
    assert "DROP TABLE IF EXISTS" in drops and "'outbox:t_x_ob'" in drops
    with pytest.raises(onceonly.ConfigurationError, match="oracle"):
        schema_statements("oracle")
