# SPDX-License-Identifier: MIT
"""Fuzz the pure core (DESIGN §6): keys, payloads, results and error texts.

Only ``OnceOnlyError`` subclasses may escape ``validate_key``, ``fingerprint``,
``canonical_json``, ``content_key``, ``codec.encode`` and ``codec.decode``; nothing at
all escapes ``error_summary`` and ``encode_error``; every call ends within ``BOUND``.

A few dozen examples per test by default, so ``make test`` stays quick; set
``HYPOTHESIS_PROFILE=fuzz`` for a long run.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import hashlib
import json
import math
import os
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onceonly import OnceOnlyError
from onceonly._core import codec, error_text
from onceonly._core.canonical import MAX_DEPTH, canonical_json
from onceonly._core.fingerprint import fingerprint
from onceonly._core.keys import content_key, validate_key

BOUND = 1.0  # seconds any single call may take

settings.register_profile("fuzz", max_examples=5_000, deadline=None)
LONG = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"
FUZZ = settings(
    max_examples=5_000 if LONG else 40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def bounded(call: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[bool, Any]:
    """``(True, result)`` or ``(False, error)`` for an OnceOnlyError; anything else escapes."""
    start = time.perf_counter()
    try:
        return True, call(*args, **kwargs)
    except OnceOnlyError as exc:
        return False, exc
    finally:
        elapsed = time.perf_counter() - start
        assert elapsed < BOUND, f"{call.__qualname__} took {elapsed:.2f} s"


def storable(text: str) -> None:
    assert "\x00" not in text
    text.encode("utf-8")


def holds_dataclass(value: Any) -> bool:
    if dataclasses.is_dataclass(value):
        return True
    if isinstance(value, dict):
        return any(holds_dataclass(k) or holds_dataclass(v) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(holds_dataclass(v) for v in value)
    return False


# -- strategies

ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)

_NASTY_NUMBERS = [
    math.nan,
    math.inf,
    -math.inf,
    -0.0,
    1e308,
    5e-324,
    Decimal("NaN"),
    Decimal("sNaN"),
    Decimal("-Infinity"),
    Decimal("1e999999999"),
    Decimal("-1E-999999999"),
    Decimal("9" * 4301),
    Decimal("0.1000000000000000000001"),
    10**5000,
    -(10**4299),
    int("9" * 4300),
]


# by index: hypothesis cannot repr an int past 4300 digits
def _nasty_number(index: int) -> Any:
    return _NASTY_NUMBERS[index]


NASTY_NUMBERS = st.sampled_from(range(len(_NASTY_NUMBERS))).map(_nasty_number)

NASTY_TEXT = st.sampled_from(
    [
        "NaN",
        "-Infinity",
        "1e999",
        '{"a": NaN}',
        "[" * 150 + "]" * 150,
        "[" * 3000 + "]" * 3000,
        '{"a": 1, "a": 2}',
        '"\\ud800"',
        '{"$text": "x"}',
        '{"$bytes": "AAE="}',
        "9" * 5000,
        "1" * 400 + ".5e-999999",
        "v2:",
        'v2:{"$datetime": ["2024-01-01T00:00:00", "../../etc/passwd"]}',
        'v2:{"$timedelta": [1e308, 0, 0]}',
        'v2:{"$decimal": "1e999999999"}',
        'v2:{"$set": [{"a": 1}]}',
        'v2:{"$dict": [[[1], 2]]}',
        'v2:{"$tuple": {"$tuple": 1}}',
        'v2:{"$x": 1, "y": 2}',
    ]
)


def deep_list(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def circular(kind: str) -> Any:
    if kind == "list":
        loop: list[Any] = []
        loop.append(loop)
        return loop
    cyc: dict[str, Any] = {}
    cyc["me"] = [cyc]
    return cyc


@dataclasses.dataclass(frozen=True)
class Item:
    sku: str
    qty: int


scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.decimals()
    | ANY_TEXT
    | st.binary(max_size=16)
    | st.dates()
    | st.datetimes(timezones=st.none() | st.just(dt.timezone.utc))
    | st.uuids()
    | NASTY_NUMBERS
    | NASTY_TEXT
)


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:  # Decimal('sNaN')
        return False
    return True


def _pairs(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.tuples(children, children)


hashables = st.recursive(scalars, _pairs, max_leaves=3).filter(_hashable)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    text_keys = ANY_TEXT | st.sampled_from(["$text", "$map", "$$x"])
    return (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(text_keys, children, max_size=4)
        | st.dictionaries(hashables, children, max_size=3)
        | st.builds(Item, ANY_TEXT, st.integers())
        | st.sets(hashables, max_size=3)
    )


payloads = (
    st.recursive(scalars, _containers, max_leaves=12)
    | st.integers(0, 2 * MAX_DEPTH).map(deep_list)
    | st.sampled_from(["list", "dict"]).map(circular)
)
# results: the same, plus what only results carry
results = payloads | st.timedeltas() | st.times() | st.builds(bytearray, st.binary(max_size=8))
result_types = st.sampled_from(
    [None, Item, list[Item], dict[int, str], tuple[int, ...], dt.date | None, Decimal, set[int]]
)

# -- keys


@FUZZ
@given(st.one_of(ANY_TEXT, st.text(max_size=300), st.integers(), st.binary(), st.none()))
def test_fuzz_validate_key(key: Any) -> None:
    """validate_key returns the key or raises InvalidKey; a valid key is storable text."""
    ok, got = bounded(validate_key, key)
    if ok:
        assert got is key
        storable(got)


# -- payloads


@FUZZ
@given(payloads | ANY_TEXT | st.binary(max_size=64) | NASTY_TEXT)
def test_fuzz_fingerprint(payload: Any) -> None:
    """Fingerprints and canonical JSON: a result or an OnceOnlyError, quickly."""
    ok, canonical = bounded(canonical_json, payload)
    ok_fp, fp = bounded(fingerprint, payload)
    ok_key, key = bounded(content_key, payload)
    assert ok == ok_fp == ok_key
    if ok:
        assert fp == "2:" + hashlib.sha256(canonical).hexdigest()
        assert key == fp[2:]
        json.loads(canonical)
    bounded(fingerprint, payload, fields=["a", "$text"])
    bounded(fingerprint, payload, custom=lambda p: [p])


# -- results


@FUZZ
@given(results)
def test_fuzz_encode_decode(value: Any) -> None:
    """encode raises only OnceOnlyErrors; what it encodes decodes (to an equal value)."""
    ok, text = bounded(codec.encode, value)
    if ok:
        storable(text)
        ok_back, back = bounded(codec.decode, text)
        assert ok_back, back
        assert codec.encode(back) == text
        # a dataclass comes back as a mapping without result_type; NaN != NaN
        if not holds_dataclass(value) and "NaN" not in text:
            assert back == value
    ok_plain, plain = bounded(codec.encode, value, what="payload")
    if ok_plain:
        storable(plain)
        json.loads(plain)


TAG_NAMES = [
    "$datetime", "$date", "$time", "$timedelta", "$decimal", "$uuid", "$bytes",
    "$bytearray", "$tuple", "$set", "$frozenset", "$dict", "$x", "$$x",
]  # fmt: skip


def _json_containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    names = st.sampled_from(TAG_NAMES) | ANY_TEXT
    return st.lists(children, max_size=3) | st.dictionaries(names, children, max_size=2)


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | ANY_TEXT,
    _json_containers,
    max_leaves=8,
)
stored_texts = (
    ANY_TEXT
    | NASTY_TEXT
    | st.builds(lambda t: "v2:" + t, ANY_TEXT)
    | json_like.map(json.dumps)
    | json_like.map(lambda v: "v2:" + json.dumps(v))
)


@FUZZ
@given(stored_texts, result_types)
def test_fuzz_decode_any_text(text: str, result_type: Any) -> None:
    """Whatever text a damaged store holds, decode raises at most an OnceOnlyError."""
    bounded(codec.decode, text, result_type)


@FUZZ
@given(results, result_types)
def test_fuzz_decode_with_a_result_type(value: Any, result_type: Any) -> None:
    """Decoding a real encoding into any (possibly unfitting) result_type is safe."""
    ok, text = bounded(codec.encode, value)
    if ok:
        bounded(codec.decode, text, result_type)


# -- error texts


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("broken")


class BrokenRepr:
    def __repr__(self) -> str:
        raise RuntimeError("broken")


error_args = st.lists(ANY_TEXT | results | st.builds(BrokenRepr) | st.builds(object), max_size=4)


@FUZZ
@given(st.sampled_from([ValueError, RuntimeError, BrokenStr, KeyError]), error_args)
def test_fuzz_error_texts(cls: type[Exception], args: list[Any]) -> None:
    """error_summary and encode_error never raise and give text any store can hold."""
    exc = cls(*args)
    start = time.perf_counter()
    summary = error_text.error_summary(exc)
    encoded = error_text.encode_error(exc)
    assert time.perf_counter() - start < BOUND
    storable(summary)
    storable(encoded)
    assert len(summary) <= error_text.ERROR_SUMMARY_LIMIT
    assert json.loads(encoded)["type"].endswith(cls.__qualname__)


# -- injectivity against a model of what a payload means

ATOMS = st.sampled_from(
    [
        None,
        True,
        False,
        0,
        1,
        1.0,
        0.5,
        0.1,
        Decimal("0.5"),
        Decimal("1.0"),
        Decimal("0.1"),
        Decimal("0.1000000000000000000001"),
        "1",
        "True",
        "true",
        "None",
        "null",
        "$text",
        "$map",
        "$$text",
        "AAE=",
        b"\x00\x01",
        bytearray(b"\x00\x01"),
        dt.date(2024, 5, 1),
        "2024-05-01",
        uuid.UUID(int=1),
        "00000000-0000-0000-0000-000000000001",
    ]
)
KEYS = st.sampled_from(
    [None, True, 1, 2, 1.5, "1", "True", "None", "$text", "$map", "$$map", "a", (1,), ("a", 1)]
)


def _small_containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (
        st.lists(children, max_size=3)
        | st.tuples(children)
        | st.dictionaries(KEYS, children, max_size=3)
    )


SMALL = st.recursive(ATOMS, _small_containers, max_leaves=4)


def meaning(value: Any) -> Any:
    """What a (nested) payload means, by the equivalences spec §2.2 intends."""
    if value is None or isinstance(value, bool):
        return ("const", value)
    if isinstance(value, (int, Decimal)):
        return ("number", Fraction(value))
    if isinstance(value, float):
        return ("number", Fraction(Decimal(repr(value))))
    if isinstance(value, str):
        return ("text", value)
    if isinstance(value, (dt.date, uuid.UUID)):
        return ("text", str(value) if isinstance(value, uuid.UUID) else value.isoformat())
    if isinstance(value, (bytes, bytearray)):
        return ("bytes", bytes(value))
    if isinstance(value, (list, tuple)):
        return ("list", tuple(meaning(v) for v in value))
    assert isinstance(value, dict)
    return ("map", frozenset((meaning(k), meaning(v)) for k, v in value.items()))


@settings(FUZZ, max_examples=1_000 if LONG else 100)
@given(st.lists(SMALL, min_size=2, max_size=25))
def test_canonical_form_is_injective(payloads: list[Any]) -> None:
    """Nested payloads share a canonical form exactly when they mean the same."""
    forms: dict[bytes, Any] = {}
    meanings: dict[Any, bytes] = {}
    for payload in payloads:
        ok, form = bounded(canonical_json, [payload])
        if not ok:  # e.g. two keys of one mapping with one canonical form
            continue
        means = meaning(payload)
        assert forms.setdefault(form, means) == means, f"collision: {form!r}"
        assert meanings.setdefault(means, form) == form, f"two forms for {payload!r}"


def twin(value: Any, how: str) -> Any:
    """``value`` with one change a lossy canonical form would not notice."""
    if isinstance(value, dict):
        return {
            (str(k) if how == "text-keys" else twin(k, how)): twin(v, how) for k, v in value.items()
        }
    if isinstance(value, list):
        return [twin(v, how) for v in value]
    if isinstance(value, tuple):
        return tuple(twin(v, how) for v in value)
    if how == "bytes-as-tags" and isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    if how == "longer-decimals" and isinstance(value, Decimal):
        return value + Decimal("1e-30")
    return value


@settings(FUZZ, max_examples=1_000 if LONG else 100)
@given(SMALL, st.sampled_from(["text-keys", "bytes-as-tags", "longer-decimals"]))
def test_canonical_form_tells_twins_apart(payload: Any, how: str) -> None:
    """A payload and its twin share a canonical form only when they mean the same."""
    other = twin(payload, how)
    ok, form = bounded(canonical_json, [payload])
    ok_other, other_form = bounded(canonical_json, [other])
    if ok and ok_other:
        assert (form == other_form) == (meaning(payload) == meaning(other))
