# SPDX-License-Identifier: MIT
"""``?`` to ``%s`` placeholder translation and SQL identifier validation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import onceonly
from onceonly._core.sql import qmark_to_format, validate_identifier

# (id, handler SQL, translated SQL, number of placeholders)
CASES = [
    ("none", "SELECT 1", "SELECT 1", 0),
    ("placeholders", "INSERT INTO t VALUES (?, ?,?)", "INSERT INTO t VALUES (%s, %s,%s)", 3),
    ("single-quoted", "SELECT '?' , ?", "SELECT '?' , %s", 1),
    (
        "doubled-quote-in-string",
        "SELECT 'it''s ?' , ? , 'a''''?'",
        "SELECT 'it''s ?' , %s , 'a''''?'",
        1,
    ),
    (
        "double-quoted-identifier",
        'SELECT "odd?col", "a""?" FROM t WHERE x = ?',
        'SELECT "odd?col", "a""?" FROM t WHERE x = %s',
        1,
    ),
    ("line-comment", "-- why?\nSELECT ? -- and?", "-- why?\nSELECT %s -- and?", 1),
    ("block-comment", "/* a ? b */ SELECT ? /* ? */", "/* a ? b */ SELECT %s /* ? */", 1),
    ("percent-operator", "SELECT 7 % 2, ?", "SELECT 7 %% 2, %s", 1),
    ("percent-in-string", "x LIKE '10%' AND y = ?", "x LIKE '10%%' AND y = %s", 1),
    ("percent-s-literal", "SELECT '%s', %s, ?", "SELECT '%%s', %%s, %s", 1),
    ("percent-in-identifier", 'SELECT "50%" FROM t', 'SELECT "50%%" FROM t', 0),
    ("percent-in-comments", "-- 100%\nSELECT 1 /* 5% */", "-- 100%%\nSELECT 1 /* 5%% */", 0),
    ("unterminated-string", "SELECT 'a ? b", "SELECT 'a ? b", 0),
    ("unterminated-comment", "SELECT ? /* open ?", "SELECT %s /* open ?", 1),
    ("minus-not-comment", "SELECT 5 - ?", "SELECT 5 - %s", 1),
    ("slash-not-comment", "SELECT 6 / ?", "SELECT 6 / %s", 1),
]


@pytest.mark.parametrize(
    ("sql", "expected", "count"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_qmark_to_format(sql: str, expected: str, count: int) -> None:
    """Placeholders outside quotes and comments become %s; every % is doubled."""
    assert qmark_to_format(sql) == expected


@pytest.mark.parametrize(("sql", "count"), [(c[1], c[3]) for c in CASES], ids=[c[0] for c in CASES])
def test_qmark_to_format_is_what_format_style_drivers_expect(sql: str, count: int) -> None:
    """Formatting the output (as psycopg does) with '?' for each %s gives the SQL back."""
    assert qmark_to_format(sql) % (("?",) * count) == sql


_SQL_TOKENS = st.sampled_from(
    ["?", "%", "'a?%'", "'it''s'", '"c?%"', "-- c?%\n", "/* c?% */", " ", "x", "- ", "/", "1"]
)


@given(st.lists(_SQL_TOKENS, max_size=20))
def test_qmark_to_format_round_trips(tokens: list[str]) -> None:
    """For any well-formed SQL, %-formatting the output with '?' restores the input."""
    sql = "".join(tokens)
    out = qmark_to_format(sql)
    assert out % (("?",) * tokens.count("?")) == sql


@pytest.mark.parametrize(
    "name",
    [
        "a;drop",
        "a; DROP TABLE x",
        "1abc",
        "a" * 64,
        '"quoted"',
        "it's",
        "",
        "a b",
        "a-b",
        "a.b",
        "tâble",
        pytest.param("onceonly_records\n", id="trailing-newline"),
        None,
        5,
    ],
)
def test_validate_identifier_rejects(name: object) -> None:
    """Anything but a plain identifier of at most 63 characters is a ConfigurationError."""
    with pytest.raises(onceonly.ConfigurationError, match="invalid table name"):
        validate_identifier(name)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["onceonly_records", "_t", "T1", "a" * 63, "records_2024_05"])
def test_validate_identifier_accepts(name: str) -> None:
    """Letters, digits and underscores, not starting with a digit, pass unchanged."""
    assert validate_identifier(name) == name


def test_validate_identifier_names_what() -> None:
    """The error names what was being validated."""
    with pytest.raises(onceonly.ConfigurationError, match="invalid outbox table"):
        validate_identifier("x;y", what="outbox table")
