# SPDX-License-Identifier: MIT
"""Handler SQL with ``?`` placeholders runs on PostgreSQL as written (docs/sql-placeholders.md)."""

from __future__ import annotations

from typing import Any

import pytest

import onceonly
from tests.conftest import StoreFactory

# (id, handler SQL, parameters, the row PostgreSQL returns)
CASES = [
    (
        "jsonb-key-exists",
        "SELECT ?::jsonb ?? 'a', ?::jsonb ?? ?",
        ('{"a": 1}', '{"b": 2}', "c"),
        (True, False),
    ),
    (
        "jsonb-any-all",
        "SELECT ?::jsonb ??| ?, ?::jsonb ??& ?",
        ('{"a": 1}', ["x", "a"], '{"a": 1}', ["x", "a"]),
        (True, False),
    ),
    (
        "dollar-quoted",
        "SELECT $$it's ? 100%$$, $t$ $$ ' ? $t$, ?::int",
        (7,),
        ("it's ? 100%", " $$ ' ? ", 7),
    ),
    ("e-string", r"SELECT E'it\'s ?', 'C:\', ?::text", ("x",), ("it's ?", "C:\\", "x")),
    ("comments", "SELECT ?::int /* a /* ? */ ' */ -- it's ?\n, ?::int", (1, 2), (1, 2)),
    ("identifier", 'SELECT ?::int AS "it\'s ?%"', (3,), (3,)),
    ("percent", "SELECT 7 % ?, '5%'", (4,), (3, "5%")),
]


@pytest.mark.parametrize(
    ("sql", "params", "row"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_handler_sql_runs_on_postgres(
    pg_store_factory: StoreFactory, sql: str, params: tuple[Any, ...], row: tuple[Any, ...]
) -> None:
    """Literals, comments and ?? (a literal ?) reach PostgreSQL unchanged; ? binds values."""
    store = pg_store_factory()
    store.migrate()
    inbox = onceonly.Inbox(store, consumer="sql")

    def handler(payload: Any, tx: onceonly.Tx) -> list[Any]:
        return list(tx.execute(sql, params).fetchone())

    assert tuple(inbox.process("k", None, handler).result) == row


def test_malformed_handler_sql_is_a_configuration_error(pg_store_factory: StoreFactory) -> None:
    """An unterminated dollar quote is refused before it reaches the server."""
    store = pg_store_factory()
    store.migrate()
    inbox = onceonly.Inbox(store, consumer="sql")
    with pytest.raises(onceonly.ConfigurationError, match="unterminated dollar-quoted"):
        inbox.process("k", None, lambda p, tx: tx.execute("SELECT $$ ?", (1,)).fetchone())
