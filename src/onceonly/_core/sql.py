# SPDX-License-Identifier: MIT
"""Placeholder translation and identifier validation for SQL stores.

Handlers write ``?`` placeholders everywhere (``tx.execute("... VALUES (?, ?)", ...)``);
drivers with the ``format`` paramstyle (psycopg) get ``%s`` instead. Quoted strings,
quoted identifiers and comments are left alone, and a literal ``%`` is doubled.
"""

from __future__ import annotations

import re

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


def qmark_to_format(sql: str) -> str:
    """Rewrite ``?`` placeholders as ``%s`` (and ``%`` as ``%%``) outside quotes/comments."""
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in ("'", '"'):
            end = i + 1
            while end < n:
                if sql[end] == ch:
                    if end + 1 < n and sql[end + 1] == ch:  # doubled quote escapes itself
                        end += 2
                        continue
                    break
                end += 1
            out.append(sql[i : end + 1].replace("%", "%%"))
            i = end + 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            end = n if end < 0 else end
            out.append(sql[i:end].replace("%", "%%"))
            i = end
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(sql[i:end].replace("%", "%%"))
            i = end
        elif ch == "?":
            out.append("%s")
            i += 1
        elif ch == "%":
            out.append("%%")
            i += 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)
