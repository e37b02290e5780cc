# SPDX-License-Identifier: MIT
"""Placeholder translation and identifier validation for SQL stores.

Handlers write ``?`` placeholders everywhere (``tx.execute("... VALUES (?, ?)", ...)``);
drivers with the ``format`` paramstyle (psycopg) get ``%s`` instead.
:func:`qmark_to_format` is a small lexer of PostgreSQL's syntax (docs/sql-placeholders.md):

* ``?`` outside literals and comments is a placeholder (``%s``); ``??`` is one literal
  ``?`` (the jsonb operators ``?``, ``?|``, ``?&``), taken in pairs from the left;
* left alone: ``'...'`` strings (``''`` escapes), ``E'...'`` strings (backslash
  escapes too), dollar-quoted strings (``$$...$$``, ``$tag$...$tag$``), ``"..."``
  identifiers (``""`` escapes), ``--`` comments, nested ``/* ... */`` comments;
* every ``%`` (inside literals and comments too) is doubled, as psycopg expects;
* an unterminated literal, identifier or block comment is a
  :class:`~onceonly.ConfigurationError`; nothing else is raised.

Plain ``'...'`` strings follow ``standard_conforming_strings = on`` (PostgreSQL's
default since 9.1): a backslash there is an ordinary character.
"""

from __future__ import annotations

import re
from typing import Any

from onceonly._core.state import Write
from onceonly.errors import ConfigurationError

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def validate_identifier(name: str, *, what: str = "table name") -> str:
    """Return ``name`` if it is a plain SQL identifier (letters, digits, ``_``; max 63)."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise ConfigurationError(
            f"invalid {what} {name!r}: use letters, digits and underscores, "
            "starting with a letter or underscore, at most 63 characters"
        )
    return name


_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_\x80-\U0010ffff][A-Za-z0-9_\x80-\U0010ffff]*)?\$")


def _word_char(ch: str) -> bool:
    """A character that continues an identifier or a number (PostgreSQL's ``ident_cont``)."""
    return ch in "_$" or (ch.isalnum() if ch.isascii() else True)


def _word_start(ch: str) -> bool:
    """A character that begins an identifier (PostgreSQL's ``ident_start``)."""
    return ch == "_" or (ch.isalpha() if ch.isascii() else True)


def _unterminated(sql: str, start: int, what: str) -> ConfigurationError:
    snippet = sql[start : start + 30]
    return ConfigurationError(
        f"unterminated {what} at character {start + 1} of the SQL ({snippet!r}...): close it, "
        "or write a literal ? outside strings as ??"
    )


def _quoted_end(sql: str, start: int, quote: str, *, backslash: bool, what: str) -> int:
    """The index just past the literal opened by ``quote`` at ``start``."""
    i, n = start + 1, len(sql)
    while i < n:
        ch = sql[i]
        if backslash and ch == "\\":
            i += 2
        elif ch == quote:
            if i + 1 < n and sql[i + 1] == quote:  # a doubled quote stands for itself
                i += 2
            else:
                return i + 1
        else:
            i += 1
    raise _unterminated(sql, start, what)


def _block_comment_end(sql: str, start: int) -> int:
    """The index just past the (possibly nested) ``/* ... */`` comment at ``start``."""
    depth, i, n = 1, start + 2, len(sql)
    while i < n:
        if sql.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif sql.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        else:
            i += 1
    raise _unterminated(sql, start, "block comment")


def qmark_to_format(sql: str) -> str:
    """Rewrite ``?`` placeholders as ``%s`` (``??`` as ``?``, ``%`` as ``%%``).

    Args:
        sql: a statement with ``?`` placeholders, in PostgreSQL's syntax.

    Returns:
        The statement for a ``format``-paramstyle driver (psycopg): formatting it with
        the parameters puts them where the ``?`` were.

    Raises:
        ConfigurationError: an unterminated string, quoted identifier, dollar-quoted
            string or block comment (nothing else is ever raised).
    """
    out: list[str] = []
    i, n = 0, len(sql)
    word = -1  # where the run of identifier/number characters ending at i began, or -1
    while i < n:
        ch = sql[i]
        end = -1
        if ch == "'":
            # E'...' (e'...'): "E" must be a word of its own, right before the quote
            escaped = word == i - 1 and sql[i - 1] in "Ee"
            what = "escape string (E'...')" if escaped else "string literal"
            end = _quoted_end(sql, i, "'", backslash=escaped, what=what)
        elif ch == '"':
            end = _quoted_end(sql, i, '"', backslash=False, what="quoted identifier")
        elif ch == "$" and (word < 0 or not _word_start(sql[word])):
            # inside an identifier (a$b) a dollar is part of the name, never a quote
            tag = _DOLLAR_TAG.match(sql, i)
            if tag is not None:
                close = sql.find(tag.group(), tag.end())
                if close < 0:
                    raise _unterminated(sql, i, f"dollar-quoted string ({tag.group()}...)")
                end = close + len(tag.group())
        elif sql.startswith("--", i):
            newline = [p for p in (sql.find("\n", i), sql.find("\r", i)) if p >= 0]
            end = min(newline) if newline else n
        elif sql.startswith("/*", i):
            end = _block_comment_end(sql, i)
        if end >= 0:  # a literal, identifier or comment: copied with % doubled
            out.append(sql[i:end].replace("%", "%%"))
            i, word = end, -1
            continue
        if ch == "?":
            if i + 1 < n and sql[i + 1] == "?":
                out.append("?")
                i += 2
            else:
                out.append("%s")
                i += 1
            word = -1
            continue
        out.append("%%" if ch == "%" else ch)
        if not _word_char(ch):
            word = -1
        elif word < 0:
            word = i
        i += 1
    return "".join(out)


def write_values(scope: str, key: str, write: Write) -> tuple[Any, ...]:
    """The bound values of a row written from ``write``, in the records table's column
    order (scope, key, state, fingerprint, token, attempts, lease seconds, result, error,
    payload, checkpoint, completed, ttl seconds): the SQL stores' inserts share it."""
    return (
        scope,
        key,
        write.state.value,
        write.fingerprint,
        write.token,
        write.attempts,
        None if write.lease_seconds is None else float(write.lease_seconds),
        write.result,
        write.error,
        write.payload,
        write.checkpoint,
        write.completed,
        None if write.ttl_seconds is None else float(write.ttl_seconds),
    )
