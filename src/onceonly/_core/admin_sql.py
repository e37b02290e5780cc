# SPDX-License-Identifier: MIT
"""The operator statements' predicates for SQL stores, rendered from ``_core.admin``
rules (no I/O). Placeholders are ``?``; the PostgreSQL admin translates them.
Each builder returns the SQL fragment and its parameters; only validated identifiers
are interpolated."""

from __future__ import annotations

from typing import Any

from onceonly._core.admin import PurgeRule, Query, ScopeStats, ascii_lower
from onceonly._core.state import State

__all__ = ["like_escape", "purge_predicates", "query_predicate", "stats_from_rows"]


def purge_predicates(rule: PurgeRule, cutoff: Any) -> list[tuple[str, list[Any], str]]:
    """The ``WHERE`` clauses of a purge, one per pass
    (:func:`onceonly._core.admin.purge_qualifies`).

    ``cutoff`` is the store's now minus ``rule.older_than``, in the store's
    representation. The first pass (completed past expiry) is a range of the expiry
    index; the second (failed and dead, only with ``include_dead``) is kept apart so an
    ``OR`` never turns the first into a full scan. Each part is ``(where, params,
    order)``: ordering a batch by ``order`` (oldest first) keeps the planner on the
    expiry index even when most rows qualify or dead tuples crowd the table.
    """
    scope = " AND scope = ?" if rule.scope is not None else ""
    extra: list[Any] = [rule.scope] if rule.scope is not None else []
    parts = [(f"expires_at <= ? AND state = 'completed'{scope}", [cutoff, *extra], "expires_at")]
    if rule.include_dead:
        where = f"state IN ('failed', 'dead') AND updated_at <= ?{scope}"
        parts.append((where, [cutoff, *extra], "updated_at"))
    return parts


def query_predicate(query: Query, now: Any, older: Any) -> tuple[str, list[Any]]:
    """The ``WHERE`` of a scan (:meth:`onceonly._core.admin.Query.matches`).

    ``older`` is ``now - query.older_than`` in the store's representation (unused when
    ``query.older_than`` is None).
    """
    clauses = ["1 = 1"]
    params: list[Any] = []
    if query.states:
        clauses.append("state IN (" + ", ".join("?" for _ in query.states) + ")")
        params.extend(s.value for s in query.states)
    if query.scope is not None:
        clauses.append("scope = ?")
        params.append(query.scope)
    if query.older_than is not None:
        clauses.append("updated_at <= ?")
        params.append(older)
    if query.lapsed:
        clauses.append("state = 'in_progress' AND (lease_until IS NULL OR lease_until <= ?)")
        params.append(now)
    if query.key_prefix is not None:
        # character-wise on every store (a LIKE range would follow the collation)
        clauses.append("substr(key , 1, ?) = ?")  # " key " is quoted on MySQL
        params.extend((len(query.key_prefix), query.key_prefix))
    if query.error_contains is not None:
        clauses.append("lower(error) LIKE ? ESCAPE '!'")
        params.append("%" + like_escape(ascii_lower(query.error_contains)) + "%")
    if query.after is not None:
        # a row comparison: the primary key's range starts there (an OR of the two
        # columns is only a filter, so page n would re-read the n - 1 pages before it)
        clauses.append("(scope, key ) > (?, ?)")  # " key " is quoted on MySQL
        params.extend(query.after)
    return " AND ".join(clauses), params


def like_escape(text: str) -> str:
    """``text`` as a literal inside a ``LIKE … ESCAPE '!'`` pattern."""
    return text.replace("!", "!!").replace("%", "!%").replace("_", "!_")


def stats_from_rows(rows: list[tuple[Any, ...]], now: float) -> list[ScopeStats]:
    """Per-scope stats from rows ``(scope, state, count, oldest created_at, expired)``
    grouped by scope and state, times as epoch seconds."""
    counts: dict[str, dict[State, int]] = {}
    oldest: dict[str, float] = {}
    expired: dict[str, int] = {}
    for scope, state, n, first, n_expired in rows:
        st = State.parse(state)
        counts.setdefault(scope, dict.fromkeys(State, 0))[st] = int(n)
        expired[scope] = expired.get(scope, 0) + int(n_expired or 0)
        if st is State.IN_PROGRESS and first is not None:
            oldest[scope] = now - float(first)
    return [
        ScopeStats(name, counts[name], oldest.get(name), expired.get(name, 0))
        for name in sorted(counts)
    ]
