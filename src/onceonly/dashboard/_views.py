# SPDX-License-Identifier: MIT
"""What the pages and the JSON API show, read through :class:`~onceonly.AsyncAdmin` and
:class:`~onceonly.outbox._outbox_async.AsyncOutbox` (no I/O of its own beyond theirs).

Record fields are turned into plain JSON values here; escaping is the templates' job
(Jinja2 autoescape) and the JSON encoder's."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import time
from dataclasses import dataclass, field
from typing import Any

from onceonly._core.admin import Query
from onceonly._core.lateness import BIN_LABELS, DUPLICATE_BINS, SECONDS_EDGES, UNKNOWN
from onceonly._core.state import Record, State
from onceonly.admin import AsyncAdmin, DuplicatePoint, LatenessReport
from onceonly.errors import ConfigurationError, StoreError

__all__ = [
    "MAX_AGE_SECONDS",
    "MAX_LIMIT",
    "Filters",
    "Summary",
    "decode_cursor",
    "encode_cursor",
    "nul_in",
    "outbox_summary",
    "parse_bool",
    "parse_limit",
    "record_json",
    "summary",
]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_LIMIT = 500
MAX_AGE_SECONDS = 100 * 365 * 86400.0  # past any record's life, inside every store's dates
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def nul_in(params: Any) -> str | None:
    """The name of the first parameter whose name or value holds NUL (``\\x00``), else
    ``None``. PostgreSQL refuses NUL in text and SQLite's ``instr`` matches it
    everywhere, so no value holding one ever reaches a store."""
    for name, value in params.items():
        if "\x00" in name or "\x00" in value:
            return str(name).replace("\x00", "\\x00")
    return None


def parse_bool(name: str, text: str) -> bool:
    """A flag: ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off`` (any case,
    spaces around ignored).

    Raises:
        ValueError: anything else (the message names ``name``).
    """
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"{name} must be one of 1, true, yes, on, 0, false, no, off; not {text!r}")


def parse_limit(text: str) -> int:
    """A page size, a whole number from 1 to :data:`MAX_LIMIT`.

    Raises:
        ValueError: anything else (the message names ``limit``).
    """
    try:
        limit = int(text.strip())
    except ValueError:
        raise ValueError(f"limit {text!r} is not a whole number") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT}, not {limit}")
    return limit


def iso(t: float | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC (``None`` stays ``None``)."""
    if t is None:
        return None
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")


def record_json(record: Record, *, full: bool = False) -> dict[str, Any]:
    """A record as JSON (``full``: every field, payload, result and checkpoint too)."""
    out: dict[str, Any] = {
        "scope": record.scope,
        "key": record.key,
        "state": record.state.value,
        "attempts": record.attempts,
        "error": record.error,
        "created_at": iso(record.created_at),
        "updated_at": iso(record.updated_at),
        "completed_at": iso(record.completed_at),
        "expires_at": iso(record.expires_at),
        "lease_until": iso(record.lease_until),
        "token": str(record.token),  # a 64-bit integer: JavaScript numbers lose digits
    }
    if full:
        out.update(
            fingerprint=record.fingerprint,
            payload=record.payload,
            result=record.result,
            checkpoint=record.checkpoint,
        )
    return out


def encode_cursor(after: tuple[str, str]) -> str:
    """The ``next`` cursor resuming after ``(scope, key)`` (opaque, URL-safe)."""
    raw = json.dumps(list(after), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str) -> tuple[str, str]:
    """The ``(scope, key)`` of a cursor.

    Raises:
        ValueError: not a cursor of :func:`encode_cursor`.
    """
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        value = json.loads(raw)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("not a cursor") from exc
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)):
        raise ValueError("not a cursor")
    return value[0], value[1]


def parse_age(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h``, ``30d`` or ``2w`` as seconds.

    Raises:
        ValueError: anything else.
    """
    text = text.strip()
    unit = text[-1:] if text[-1:] in _UNITS else ""
    number = float(text[: len(text) - len(unit)])
    if not 0 <= number < float("inf"):
        raise ValueError("an age is a non-negative number")
    seconds = number * _UNITS[unit or "s"]
    if seconds > MAX_AGE_SECONDS:
        raise ValueError("an age is at most 100 years")
    return seconds


@dataclass(frozen=True)
class Filters:
    """The records list's filters, as the query string carries them.

    ``q`` is the error text searched for, ``key`` the key prefix, ``age`` the least time
    since the last write (``15m``, ``2h``, ``1d``), ``after`` the cursor of the page.
    """

    scope: str = ""
    state: str = ""
    key: str = ""
    q: str = ""
    age: str = ""
    after: str = ""
    limit: int = 50
    errors: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, params: Any) -> Filters:
        """From a query string or form (a mapping of str to str); bad values are
        listed in ``errors`` (each naming its parameter) and ignored."""
        errors: list[str] = []
        nul = nul_in({k: params.get(k, "") for k in ("scope", "state", "key", "q", "age")})
        if nul is not None:
            errors.append(f"{nul} holds a NUL character")
        state = params.get("state", "")
        if state and state not in {s.value for s in State}:
            errors.append(f"unknown state {state!r}")
            state = ""
        age = params.get("age", "").strip()
        if age:
            try:
                parse_age(age)
            except ValueError:
                errors.append(
                    f"age {age!r} is not a duration such as 15m, 2h or 1d (at most 100 years)"
                )
                age = ""
        after = params.get("after", "")
        if after:
            try:
                decode_cursor(after)
            except ValueError:
                errors.append("the page cursor is not valid; showing the first page")
                after = ""
        limit = 50
        if "limit" in params:
            try:
                limit = parse_limit(params["limit"])
            except ValueError as exc:
                errors.append(str(exc))
        clean = nul is None  # a value holding NUL never reaches a query
        return cls(
            scope=params.get("scope", "") if clean else "",
            state=state,
            key=params.get("key", "") if clean else "",
            q=params.get("q", "") if clean else "",
            age=age,
            after=after,
            limit=limit,
            errors=errors,
        )

    def query(self, *, limit: int | None = None, states: tuple[State, ...] | None = None) -> Query:
        """The admin :class:`~onceonly._core.admin.Query` of these filters."""
        return Query(
            states if states is not None else ((State(self.state),) if self.state else ()),
            self.scope or None,
            parse_age(self.age) if self.age else None,
            after=decode_cursor(self.after) if self.after else None,
            limit=self.limit if limit is None else limit,
            key_prefix=self.key or None,
            error_contains=self.q or None,
        )

    def params(self, **changes: str) -> dict[str, str]:
        """The non-empty filters as query-string parameters, with ``changes``."""
        out = {
            "scope": self.scope,
            "state": self.state,
            "key": self.key,
            "q": self.q,
            "age": self.age,
            "after": self.after,
        }
        if self.limit != 50:
            out["limit"] = str(self.limit)
        out.update(changes)
        return {k: v for k, v in out.items() if v}


@dataclass(frozen=True)
class Summary:
    """The overview's numbers (see :func:`summary`)."""

    total: int
    by_state: dict[str, int]
    by_scope: dict[str, dict[str, int]]
    oldest_in_progress: dict[str, float]
    expired: dict[str, int]
    now: float
    duplicates: list[DuplicatePoint]
    window: float
    outbox: dict[str, Any] | None
    lateness: LatenessReport | None = None  # None: nothing recorded in the window
    source: str = "DuplicateCounter"  # what ``duplicates`` was drawn from

    def json(self) -> dict[str, Any]:
        """The ``GET /api/summary`` body."""
        scopes = sorted({s for p in self.duplicates for s in p.counts} | set(self.by_scope))
        return {
            "total": self.total,
            "by_state": self.by_state,
            "by_scope": self.by_scope,
            "failed": self.by_state.get("failed", 0),
            "dead": self.by_state.get("dead", 0),
            "oldest_in_progress_seconds": self.oldest_in_progress,
            "expired": self.expired,
            "now": iso(self.now),
            "duplicates": {
                "window_seconds": self.window,
                "source": self.source,
                "intervals": [
                    {
                        "start": iso(p.start),
                        "seconds": p.seconds,
                        "scopes": {
                            s: {"claims": c, "replays": r, "rate": p.rate(s)}
                            for s, (c, r) in sorted(p.counts.items())
                        },
                    }
                    for p in self.duplicates
                ],
                "scopes": scopes,
            },
            "lateness": None if self.lateness is None else lateness_json(self.lateness),
            "outbox": self.outbox,
        }


def lateness_json(report: LatenessReport) -> dict[str, Any]:
    """The ``lateness`` part of ``GET /api/summary``: duplicates per lateness bin."""

    def bins(counts: dict[int, int]) -> list[dict[str, Any]]:
        out = []
        for b in DUPLICATE_BINS:
            upper = SECONDS_EDGES[b - 1] if b <= len(SECONDS_EDGES) else None
            out.append(
                {"bin": b, "label": BIN_LABELS[b], "below_seconds": upper, "count": counts[b]}
            )
        return out

    return {
        "source": "DuplicateRecorder",
        "window_seconds": report.window,
        "duplicates": report.duplicates,
        "bins": bins(report.bins),
        "unknown": report.bins[UNKNOWN],
        "ttl_seconds": report.ttl,
        "by_scope": {
            scope: {"bins": bins(counts), "unknown": counts[UNKNOWN]}
            for scope, counts in sorted(report.by_scope.items())
        },
    }


async def outbox_summary(store: Any, table: str | None) -> dict[str, Any] | None:
    """Pending and dead outbox rows and the relay's lag (the oldest pending row's age);
    ``None`` when the store has no outbox table."""
    from onceonly.outbox import AsyncOutbox

    try:
        outbox = AsyncOutbox(store, table=table)
        counts = await outbox.counts()
        oldest = await outbox.rows("pending", 1)
    except (ConfigurationError, StoreError):
        return None
    lag = max(0.0, time.time() - oldest[0].message.created_at) if oldest else None
    return {**counts, "lag_seconds": lag}


async def summary(
    admin: AsyncAdmin, *, window: float, points: int, outbox_table: str | None, outbox: bool
) -> Summary:
    """Everything the overview shows, read now."""
    report = await admin.stats(window=window)
    by_state = {s.value: 0 for s in State}
    by_scope: dict[str, dict[str, int]] = {}
    oldest: dict[str, float] = {}
    expired: dict[str, int] = {}
    for s in report.scopes:
        if not s.total:
            continue  # a scope known only from the counters
        by_scope[s.scope] = {state.value: s.counts.get(state, 0) for state in State}
        for state in State:
            by_state[state.value] += s.counts.get(state, 0)
        if s.oldest_in_progress is not None:
            oldest[s.scope] = s.oldest_in_progress
        if s.expired:
            expired[s.scope] = s.expired
    # The duplicate rate comes from the DuplicateRecorder's buckets; the older
    # DuplicateCounter counters are the fallback when nothing was recorded.
    lateness: LatenessReport | None = await admin.duplicate_lateness(window=window, points=points)
    if lateness is not None and lateness.recorded:
        history, source = lateness.points, "DuplicateRecorder"
    else:
        lateness, source = None, "DuplicateCounter"
        history = await admin.duplicate_history(window=window, points=points)
    box = await outbox_summary(admin.store, outbox_table) if outbox else None
    return Summary(
        sum(by_state.values()), by_state, by_scope, oldest, expired, report.now, history,
        window, box, lateness, source,
    )  # fmt: skip
