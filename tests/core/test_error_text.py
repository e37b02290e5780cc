# SPDX-License-Identifier: MIT
"""Error texts stored in a record: any store can hold them, and building them never fails."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from onceonly._core import error_text


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class BrokenArgs(Exception):
    @property  # type: ignore[override]
    def args(self) -> Any:
        raise RuntimeError("no args either")


class BrokenRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class NotStr(Exception):
    def __str__(self) -> Any:
        return 42  # noqa: PLE0307 -- a broken __str__ on purpose


def storable(text: str) -> None:
    """What PostgreSQL text and SQLite accept: UTF-8 encodable, no NUL."""
    assert "\x00" not in text
    text.encode("utf-8")


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("nul \x00 in the middle"),
        ValueError("lone \ud800 surrogate"),
        ValueError("\udcff" * 3000),
        ValueError("\x00" * 5000),
        BrokenStr("x"),
        BrokenArgs("x"),
        NotStr(),
    ],
    ids=[
        "nul",
        "surrogate",
        "many-surrogates",
        "many-nuls",
        "broken-str",
        "broken-args",
        "not-str",
    ],
)
def test_error_summary_is_always_storable(exc: BaseException) -> None:
    """No NUL, no lone surrogate, at most ``limit`` characters, and never an exception."""
    summary = error_text.error_summary(exc)
    storable(summary)
    assert 0 < len(summary) <= 2000
    assert summary.startswith(type(exc).__qualname__ + ": ")


def test_error_summary_escapes_visibly() -> None:
    """Replaced characters stay visible to an operator as escapes."""
    assert error_text.error_summary(ValueError("a\x00b\ud800c")) == "ValueError: a\\x00b\\ud800c"


def test_error_summary_of_a_broken_str_names_the_class() -> None:
    """An exception whose __str__ raises is still summarised by its class."""
    assert error_text.error_summary(BrokenStr("x")).startswith("BrokenStr: <")


@pytest.mark.parametrize(
    "exc",
    [
        ValueError(object(), math.nan, "\ud800", b"\x00", BrokenRepr()),
        ValueError("\x00nul"),
        ValueError({1: "non-text key"}, {"a": [math.inf]}),
        ValueError("x" * 100_000),
        BrokenArgs("x"),
        ValueError(10**5000),
    ],
    ids=["mixed", "nul", "non-json", "huge", "broken-args", "huge-int"],
)
def test_encode_error_never_raises_and_is_storable(exc: BaseException) -> None:
    """The cached error is JSON any store can hold; odd arguments become their repr."""
    text = error_text.encode_error(exc)
    storable(text)
    data = json.loads(text)
    assert data["type"].endswith(type(exc).__qualname__)
    assert len(text) <= 20_000
    for arg in data["args"]:
        assert isinstance(arg, (str, int, float, bool, list, dict, type(None)))


def test_encode_error_uses_repr_for_non_json_args() -> None:
    """Arguments JSON cannot hold are stored as their repr, sanitised."""
    data = json.loads(error_text.encode_error(ValueError(b"\x00", math.nan, BrokenRepr())))
    assert data["args"][0] == "b'\\x00'"
    assert data["args"][1] == "nan"
    assert data["args"][2].startswith("<unrepresentable")


@pytest.mark.parametrize("text", ["", "{", "[]", '{"type": 1}', '{"type": "x", "args": 3}'])
def test_decode_error_of_damaged_text_gives_none(text: str) -> None:
    """A damaged cached error is not rebuilt (the caller raises ReplayedError)."""
    assert error_text.decode_error(text, (ValueError,)) is None
