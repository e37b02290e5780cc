# SPDX-License-Identifier: MIT
"""On every store: a replay returns what the first run returned, types included, and
odd error texts are recorded like any other failure (spec §2.5, §2.7)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import pytest

import onceonly

RESULT = {
    "at": dt.datetime(2024, 5, 1, 9, 30, tzinfo=dt.timezone.utc),
    "day": dt.date(2024, 5, 1),
    "amount": Decimal("12.50"),
    "id": uuid.UUID(int=42),
    "lines": (1, 2),
    "by_id": {1: "a", None: "b"},
    "raw": b"\x00\xff",
    "tags": frozenset({"x"}),
    "$looks_like_a_tag": {"$tuple": [1]},
}


def kinds(value: Any) -> Any:
    """The value with every part replaced by its type, to compare types recursively."""
    if isinstance(value, dict):
        return {(type(k), k): kinds(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return (type(value), [kinds(v) for v in value])
    return type(value)


def test_inbox_replay_keeps_types(store: Any) -> None:
    """A replayed inbox result equals the first one, with the same types."""
    inbox = onceonly.Inbox(store, consumer="c")
    first = inbox.process("k", {"n": 1}, lambda p, tx: RESULT)
    again = inbox.process("k", {"n": 1}, lambda p, tx: None)
    assert again.replayed
    assert again.result == first.result == RESULT
    assert kinds(again.result) == kinds(RESULT)


@dataclasses.dataclass(frozen=True)
class Receipt:
    order: str
    at: dt.datetime
    amount: Decimal
    lines: tuple[int, ...]


def test_idempotent_replay_rebuilds_the_annotated_dataclass(leased_store: Any) -> None:
    """@idempotent rebuilds the return annotation's dataclass with typed fields."""
    runs: list[str] = []

    @onceonly.idempotent(leased_store, key=lambda order: order, scope="charge")
    def charge(order: str) -> Receipt:
        runs.append(order)
        return Receipt(
            order, dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc), Decimal("9.90"), (3,)
        )

    first = charge("o-1")
    again = charge("o-1")
    assert runs == ["o-1"]
    assert again == first
    assert isinstance(again.at, dt.datetime)
    assert isinstance(again.amount, Decimal)
    assert isinstance(again.lines, tuple)


ODD = "nul \x00, lone \ud800, and more"


def test_odd_error_texts_are_recorded(store: Any) -> None:
    """An error whose text holds NUL and a lone surrogate still counts as an attempt."""
    inbox = onceonly.Inbox(store, consumer="c", max_attempts=2)

    def boom(payload: Any, tx: Any) -> None:
        raise ValueError(ODD)

    for _ in range(2):
        with pytest.raises(ValueError):
            inbox.process("k", {}, boom)
    with pytest.raises(onceonly.DeadLettered) as info:
        inbox.process("k", {}, boom)
    assert info.value.attempts == 2
    assert info.value.error == "ValueError: nul \\x00, lone \\ud800, and more"


def test_odd_cached_errors_replay(store: Any) -> None:
    """A cached error with odd arguments is stored and replayed with its arguments."""
    inbox = onceonly.Inbox(store, consumer="c", cache_errors=(ValueError,))

    def boom(payload: Any, tx: Any) -> None:
        raise ValueError(ODD, object())

    with pytest.raises(ValueError):
        inbox.process("k", {}, boom)
    with pytest.raises(ValueError) as info:
        inbox.process("k", {}, lambda p, tx: None)
    assert info.value.args[0] == ODD
    assert info.value.args[1].startswith("<object object at")
