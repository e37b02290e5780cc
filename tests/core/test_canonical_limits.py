# SPDX-License-Identifier: MIT
"""Payloads that cannot be fingerprinted fail fast and typed; the canonical form is
injective; fingerprints name their scheme (spec §2.2)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import math
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

import onceonly
from onceonly._core import canonical
from onceonly._core import fingerprint as fp_module
from onceonly._core.canonical import canonical_json
from onceonly._core.fingerprint import fingerprint
from onceonly._core.keys import content_key, validate_key

BOUND = 1.0  # seconds any single call may take


def deep_list(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def circular_list() -> Any:
    value: list[Any] = [1]
    value.append(value)
    return value


def circular_dict() -> Any:
    value: dict[str, Any] = {"a": 1}
    value["self"] = {"inner": value}
    return value


def timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    try:
        call()
    finally:
        elapsed = time.perf_counter() - start
    return elapsed


UNFINGERPRINTABLE: dict[str, Callable[[], Any]] = {
    "json-NaN": lambda: "NaN",
    "json-Infinity": lambda: "Infinity",
    "json--Infinity": lambda: "-Infinity",
    "json-1e999": lambda: "1e999",
    "json-nested-NaN": lambda: '{"a": [1, NaN]}',
    "json-bytes-1e999": lambda: b'{"a": -1e999}',
    "float-nan": lambda: math.nan,
    "float-inf": lambda: {"x": [math.inf]},
    "float-1e999": lambda: float("1e999"),
    "decimal-huge-exponent": lambda: Decimal("1e999999999"),
    "decimal-huge-negative": lambda: {"d": Decimal("-9.5E+999999999")},
    "decimal-snan": lambda: Decimal("sNaN"),
    "int-too-many-digits": lambda: 10**5000,
    "json-int-too-many-digits": lambda: "[" + "7" * 5000 + "]",
    "decimal-too-many-digits": lambda: Decimal("1" * 5000 + ".5"),
    "too-deep": lambda: deep_list(canonical.MAX_DEPTH + 1),
    "too-deep-dict": lambda: {"a": deep_list(canonical.MAX_DEPTH)},
    "json-too-deep": lambda: "[" * 200 + "]" * 200,
    "json-far-too-deep": lambda: "[" * 200_000 + "]" * 200_000,
    "circular-list": circular_list,
    "circular-dict": circular_dict,
    "surrogate-text": lambda: "abc\ud800",
    "surrogate-json-escape": lambda: '{"a": "\\udc00"}',
    "surrogate-value": lambda: ["ok", "\udfff"],
    "surrogate-key": lambda: {"k\ud800": 1},
    "json-duplicate-names": lambda: '{"a": 1, "a": 2}',
    "same-canonical-keys": lambda: {dt.date(2024, 5, 1): 1, "2024-05-01": 2},
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("make", UNFINGERPRINTABLE.values(), ids=UNFINGERPRINTABLE.keys())
def test_unfingerprintable_payloads_raise_encoding_error_fast(make: Callable[[], Any]) -> None:
    """Non-finite numbers, huge numbers, deep or circular data, lone surrogates: EncodingError."""
    payload = make()
    calls = [
        lambda: canonical_json(payload),
        lambda: fingerprint(payload),
        lambda: content_key(payload),
    ]
    if not isinstance(payload, (str, bytes)):  # custom text is hashed as it is
        calls.append(lambda: fingerprint(payload, custom=lambda p: p))
    for call in calls:

        def expect_error(call: Callable[[], Any] = call) -> None:
            with pytest.raises(onceonly.EncodingError):
                call()

        assert timed(expect_error) < BOUND


def test_limits_are_module_constants() -> None:
    """The depth and digit limits are explicit and documented."""
    assert 64 <= canonical.MAX_DEPTH <= 100
    assert canonical.MAX_INT_DIGITS == 4300
    assert "MAX_DEPTH" in (canonical.__doc__ or "")
    assert "MAX_INT_DIGITS" in (canonical.__doc__ or "")


def test_values_at_the_limits_are_accepted() -> None:
    """Exactly MAX_DEPTH levels and MAX_INT_DIGITS digits still fingerprint."""
    canonical_json(deep_list(canonical.MAX_DEPTH))
    big = int("9" * canonical.MAX_INT_DIGITS)
    assert canonical_json(big) == str(big).encode()
    assert canonical_json(-big) == b"-" + str(big).encode()
    assert canonical_json(Decimal(big)) == str(big).encode()
    assert canonical_json(Decimal("1e4299")) == b"1" + b"0" * 4299
    with pytest.raises(onceonly.EncodingError, match="digits"):
        canonical_json(Decimal("1e4300"))


def test_shared_but_acyclic_references_are_fine() -> None:
    """The same list twice (a DAG, not a cycle) is not mistaken for a cycle."""
    shared = [1, 2]
    assert canonical_json({"a": shared, "b": shared}) == b'{"a":[1,2],"b":[1,2]}'


# -- injectivity


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ("abc", {"$text": "abc"}),
        ("abc", '{"$text": "abc"}'),
        (b"\x00\x01", {"$bytes": "AAE="}),
        ([b"\x00"], [{"$bytes": "AA=="}]),
        ({1: "a"}, {"1": "a"}),
        ({True: 1}, {"True": 1}),
        ({True: 1}, {"true": 1}),
        ({True: 1}, {1: 1}),
        ({None: 1, "None": 2}, {"None": 2}),
        ({None: 1, "None": 2}, {None: 2, "None": 1}),
        ({(1, 2): "x"}, {"[1,2]": "x"}),
        ({"$map": [[1, "a"]]}, {1: "a"}),
        ({"$decimal": "1e-30"}, Decimal("1e-30")),
        (Decimal("0.1"), Decimal("0.1000000000000000000001")),
        ({"$": 1}, {"$$": 1}),
        ({"$$text": "a"}, {"$text": "a"}),
    ],
)
def test_different_payloads_never_share_a_fingerprint(left: Any, right: Any) -> None:
    """Tags cannot be forged by user data, non-text keys stay typed, no entry is dropped."""
    assert canonical_json(left) != canonical_json(right)
    assert fingerprint(left) != fingerprint(right)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        (1, 1.0),
        (1, Decimal("1.000")),
        (0.5, Decimal("0.5")),
        (1e-7, Decimal("1E-7")),
        (2.5, Decimal("2.50")),
        ({"a": 1, "b": 2}, '{"b": 2.0, "a": 1}'),
        ({"a": 1}, b'{"a":1}'),
        ((1, 2), [1, 2]),
        (dt.date(2024, 5, 1), '"2024-05-01"'),
        ({dt.date(2024, 5, 1): 1}, {"2024-05-01": 1}),
        ({1: "a"}, {1.0: "a"}),
        ({"$x": 1}, '{"$x": 1}'),
        (uuid.UUID(int=1), '"00000000-0000-0000-0000-000000000001"'),
    ],
)
def test_intended_equivalences_are_kept(left: Any, right: Any) -> None:
    """Equal numbers, JSON text and its value, tuples and lists, ISO dates: one form."""
    assert canonical_json(left) == canonical_json(right)


def test_plain_json_keeps_its_scheme_1_bytes() -> None:
    """Plain JSON data canonicalises as before, so content keys derived from it are stable."""
    payload = {"b": [1, 2.5, "x", None, True], "a": {"é": -0.0}}
    assert canonical_json(payload) == b'{"a":{"\xc3\xa9":0},"b":[1,2.5,"x",null,true]}'
    assert content_key(payload) == hashlib.sha256(canonical_json(payload)).hexdigest()


def test_user_dollar_keys_are_escaped() -> None:
    """A user key starting with '$' gets one more '$'; tags keep a single one."""
    assert canonical_json({"$text": "a", "b": 1}) == b'{"$$text":"a","b":1}'
    assert canonical_json("not json") == b'{"$text":"not json"}'
    assert canonical_json({1: "a"}) == b'{"$map":[[1,"a"]]}'


def test_non_text_keys_are_sorted_by_their_canonical_form() -> None:
    """Insertion order of a mapping with non-text keys does not matter."""
    assert canonical_json({2: "b", None: "n", 1: "a"}) == canonical_json(
        {1: "a", None: "n", 2: "b"}
    )


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int


def test_frozen_dataclass_keys() -> None:
    """Hashable composite keys (tuples, frozen dataclasses) are typed map entries."""
    assert canonical_json({Point(1, 2): "p"}) == b'{"$map":[[{"x":1,"y":2},"p"]]}'
    assert canonical_json({(1, 2): "t"}) == b'{"$map":[[[1,2],"t"]]}'


# -- fingerprint schemes


def test_fingerprint_names_its_scheme() -> None:
    """Default fingerprints are '2:' + SHA-256 hex; custom ones have their own marker."""
    fp = fingerprint({"a": 1})
    assert fp_module.SCHEME == "2"
    assert fp == "2:" + hashlib.sha256(b'{"a":1}').hexdigest()
    assert fp_module.scheme_of(fp) == "2"
    assert fingerprint("x", custom=lambda p: p).startswith("c:")
    assert fingerprint("x", custom=lambda p: {"v": p}).startswith("c2:")


@pytest.mark.parametrize(
    ("stored", "incoming", "expected"),
    [
        ("0" * 64, "f" * 64, True),  # two scheme-1 fingerprints
        ("a" * 64, "2:" + "a" * 64, False),  # a record from before the upgrade
        ("2:" + "a" * 64, "2:" + "b" * 64, True),
        ("c:" + "a" * 64, "c:" + "b" * 64, True),
        ("c:" + "a" * 64, "c2:" + "a" * 64, False),
        ("c:" + "a" * 64, "2:" + "a" * 64, False),
        ("fp-a", "fp-b", True),  # unversioned text is scheme 1
        ("3:xyz", "2:" + "a" * 64, False),  # a scheme from a newer release
    ],
)
def test_comparable(stored: str, incoming: str, expected: bool) -> None:
    """Two fingerprints are comparable only when one scheme made both."""
    assert fp_module.comparable(stored, incoming) is expected
    assert fp_module.comparable(incoming, stored) is expected


def test_scheme_of_unversioned_is_1() -> None:
    """A fingerprint without a colon (the old 64 hex characters) is scheme 1."""
    assert fp_module.scheme_of(hashlib.sha256(b"x").hexdigest()) == "1"
    assert fp_module.scheme_of("c:" + "0" * 64) == "c"


# -- keys


@pytest.mark.parametrize("key", ["\ud800", "ab\udfffc", "k\udc80" * 3])
def test_validate_key_rejects_lone_surrogates(key: str) -> None:
    """A key with a lone surrogate cannot be stored as UTF-8: InvalidKey."""
    with pytest.raises(onceonly.InvalidKey, match="surrogate"):
        validate_key(key)


@pytest.mark.parametrize("part", [10**5000, math.nan, -math.inf], ids=["huge", "nan", "-inf"])
def test_composite_key_rejects_unprintable_parts(part: object) -> None:
    """Huge or non-finite numbers are InvalidKey, not ValueError from str()."""
    with pytest.raises(onceonly.InvalidKey):
        onceonly.composite_key("a", part)


@pytest.mark.parametrize("at", [math.nan, math.inf, -math.inf])
def test_time_window_key_rejects_non_finite_times(at: float) -> None:
    """A non-finite instant is InvalidKey, not ValueError/OverflowError from floor()."""
    with pytest.raises(onceonly.InvalidKey):
        onceonly.time_window_key("digest", 60, at)
