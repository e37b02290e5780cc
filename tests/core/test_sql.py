# SPDX-License-Identifier: MIT
"""``?`` to ``%s`` placeholder translation and SQL identifier validation
(docs/sql-placeholders.md)."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given
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
    ("minus-not-comment", "SELECT 5 - ?", "SELECT 5 - %s", 1),
    ("slash-not-comment", "SELECT 6 / ?", "SELECT 6 / %s", 1),
    ("adjacent-strings", "SELECT 'a' 'b?' , ?", "SELECT 'a' 'b?' , %s", 1),
    ("empty-string", "SELECT '', ?, ''''", "SELECT '', %s, ''''", 1),
    ("backslash-in-plain-string", r"SELECT 'C:\', ?", r"SELECT 'C:\', %s", 1),
    ("e-string-backslash-quote", r"SELECT E'it\'s ?', ?", r"SELECT E'it\'s ?', %s", 1),
    ("e-string-lowercase", r"SELECT e'\\', ?, e'a\'?'", r"SELECT e'\\', %s, e'a\'?'", 1),
    ("e-string-doubled-quote", "SELECT E'it''s ?', ?", "SELECT E'it''s ?', %s", 1),
    ("e-string-percent", r"SELECT E'5%\'', ?", r"SELECT E'5%%\'', %s", 1),
    ("word-ending-in-e-is-no-e-string", r"SELECT name'\', ?", r"SELECT name'\', %s", 1),
    (
        "national-and-bit-strings",
        "SELECT N'?', B'01', X'1F', ?",
        "SELECT N'?', B'01', X'1F', %s",
        1,
    ),
    ("unicode-escape-string", r"SELECT U&'d\0061?', ?", r"SELECT U&'d\0061?', %s", 1),
    ("dollar-quoted", "SELECT $$it's ? %$$, ?", "SELECT $$it's ? %%$$, %s", 1),
    ("dollar-tag", "SELECT $fn$ $$ ' ? $fn$, ?", "SELECT $fn$ $$ ' ? $fn$, %s", 1),
    ("dollar-tag-unicode", "SELECT $é_1$ ? $é_1$ , ?", "SELECT $é_1$ ? $é_1$ , %s", 1),
    (
        "dollar-body",
        "CREATE FUNCTION f() RETURNS int AS $body$ SELECT 1 -- ?\n $body$ LANGUAGE sql; ?",
        "CREATE FUNCTION f() RETURNS int AS $body$ SELECT 1 -- ?\n $body$ LANGUAGE sql; %s",
        1,
    ),
    ("dollar-tags-are-case-sensitive", "SELECT $a$ $A$ ? $a$, ?", "SELECT $a$ $A$ ? $a$, %s", 1),
    ("positional-parameter-is-no-quote", "SELECT $1, ?, $2", "SELECT $1, %s, $2", 1),
    ("dollar-inside-identifier", "SELECT a$b$ , ? , c$$", "SELECT a$b$ , %s , c$$", 1),
    ("dollar-after-number", "SELECT 1$$?$$, ?", "SELECT 1$$?$$, %s", 1),
    ("quoted-identifier-quotes", """SELECT "it's", ?, "$$" """, """SELECT "it's", %s, "$$" """, 1),
    ("line-comment-quote", "SELECT ? -- it's\n, ?", "SELECT %s -- it's\n, %s", 2),
    ("line-comment-carriage-return", "SELECT 1 -- ?\r?", "SELECT 1 -- ?\r%s", 1),
    ("line-comment-at-end", "SELECT ? -- ?", "SELECT %s -- ?", 1),
    ("nested-block-comment", "/* a /* ? */ ? */ SELECT ?", "/* a /* ? */ ? */ SELECT %s", 1),
    ("block-comment-quote", "/* it's */ SELECT ?", "/* it's */ SELECT %s", 1),
    (
        "jsonb-key-exists",
        "SELECT data ?? 'k' FROM t WHERE id = ?",
        "SELECT data ? 'k' FROM t WHERE id = %s",
        1,
    ),
    ("jsonb-key-exists-param", "WHERE data ?? ?", "WHERE data ? %s", 1),
    ("jsonb-any-all", "WHERE d ??| ? AND d ??& ?", "WHERE d ?| %s AND d ?& %s", 2),
    ("question-marks-pair-from-the-left", "SELECT ???", "SELECT ?%s", 1),
    ("double-question-in-string", "SELECT '??', ?", "SELECT '??', %s", 1),
]


@pytest.mark.parametrize(
    ("sql", "expected", "count"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_qmark_to_format(sql: str, expected: str, count: int) -> None:
    """Placeholders outside quotes and comments become %s; every % is doubled."""
    assert qmark_to_format(sql) == expected


# what the driver runs, where the case writes ?? for a literal ?
RUNS = {
    "jsonb-key-exists": "SELECT data ? 'k' FROM t WHERE id = ?",
    "jsonb-key-exists-param": "WHERE data ? ?",
    "jsonb-any-all": "WHERE d ?| ? AND d ?& ?",
    "question-marks-pair-from-the-left": "SELECT ??",
}


@pytest.mark.parametrize(
    ("case", "sql", "count"), [(c[0], c[1], c[3]) for c in CASES], ids=[c[0] for c in CASES]
)
def test_qmark_to_format_is_what_format_style_drivers_expect(
    case: str, sql: str, count: int
) -> None:
    """Formatting the output (as psycopg does) with '?' for each %s gives the SQL back."""
    assert qmark_to_format(sql) % (("?",) * count) == RUNS.get(case, sql)


def _formatted(out: str) -> str:
    """``out`` %-formatted with '?' for each parameter."""
    return re.sub(r"%[%s]", lambda m: "%" if m.group() == "%%" else "?", out)


# (id, malformed SQL, what the error names)
MALFORMED = [
    ("unterminated-string", "SELECT 'a ? b", "string literal"),
    ("unterminated-string-after-doubled-quote", "SELECT 'it''", "string literal"),
    ("unterminated-e-string", r"SELECT E'it\'s ?", "escape string"),
    ("e-string-trailing-backslash", "SELECT E'abc\\", "escape string"),
    ("unterminated-identifier", 'SELECT "odd?col', "quoted identifier"),
    ("unterminated-dollar-quote", "SELECT $$ ? ", "dollar-quoted"),
    ("unterminated-dollar-tag", "SELECT $fn$ ? $$ $FN$", r"dollar-quoted string \(\$fn\$"),
    ("unterminated-comment", "SELECT ? /* open ?", "block comment"),
    ("unterminated-nested-comment", "SELECT 1 /* a /* b */ ?", "block comment"),
]


@pytest.mark.parametrize(("sql", "what"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_qmark_to_format_rejects_malformed_sql(sql: str, what: str) -> None:
    """An unterminated literal, identifier or comment is a ConfigurationError naming it."""
    with pytest.raises(onceonly.ConfigurationError, match=f"unterminated {what}"):
        qmark_to_format(sql)


_SQL_TOKENS = st.sampled_from(
    [
        "?",
        "??",
        "%",
        "%s",
        "'a?%'",
        "'it''s'",
        "''",
        r"E'\'?%'",
        r"e'\\'",
        "E'a''?'",
        "$$ ' ? % $$",
        "$q$ $$ ? $q$",
        "$1",
        "a$b$",
        '"c?%"',
        '"a""?"',
        "-- c?%'\n",
        "/* c?% */",
        "/* a /* ? */ ' */",
        "x",
        "E",
        "-",
        "/",
        "1",
    ]
)


@given(st.lists(_SQL_TOKENS, max_size=20))
@example(["E", "'it''s'"])
def test_qmark_to_format_round_trips(tokens: list[str]) -> None:
    """For well-formed SQL, %-formatting the output with '?' gives the input, ?? read as ?."""
    sql = " ".join(tokens)
    out = qmark_to_format(sql)
    expected = " ".join("?" if t == "??" else t for t in tokens)
    assert out % (("?",) * tokens.count("?")) == expected


_ANY_SQL = st.text(alphabet=st.sampled_from("?%'\"$-/*\\\nEeab_1 é")) | st.text()


@given(_ANY_SQL)
def test_qmark_to_format_never_raises_anything_else(sql: str) -> None:
    """Any text either translates to well-formed format SQL or is a ConfigurationError."""
    try:
        out = qmark_to_format(sql)
    except onceonly.ConfigurationError:
        return
    assert re.fullmatch(r"(?:[^%]|%%|%s)*", out, re.DOTALL)  # psycopg accepts it
    ran = _formatted(out)
    assert ran == sql or ("??" in sql and len(ran) < len(sql))


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
