# SPDX-License-Identifier: MIT
"""The C-speed path of canonical JSON for nested JSON-like payloads writes exactly the
bytes of the general walk (spec §2.2), or leaves the payload to it.

A payload written differently by the two would give a redelivery another fingerprint: a
PayloadMismatch instead of a replay. Hypothesis generates nested values around every
edge where ``json.dumps`` and the walk could part: floats (NaN, infinities, ``-0.0``,
``1e16``, integral floats, precision), big ints, bool beside int, int/str enums, tuples
beside lists, dict subclasses, non-str and ``$`` keys, non-ASCII keys (their sort
order), lone surrogates, and nesting around ``MAX_DEPTH``.
"""

from __future__ import annotations

import collections
import enum
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceonly._core import canonical
from onceonly._core.canonical import MAX_DEPTH
from onceonly.errors import InvalidPayload


class Level(enum.IntEnum):
    LOW = 1


class Colour(str, enum.Enum):
    RED = "red"


_floats = st.one_of(
    st.floats(),  # NaN and infinities included
    st.floats(min_value=-1e6, max_value=1e6).map(lambda f: float(round(f))),  # integral
    st.sampled_from(
        [
            -0.0,
            0.0,
            1e16,
            -1e16,
            1e16 + 2,
            1.5e15,
            0.1,
            1 / 3,
            5e-324,
            1.7976931348623157e308,
            2.0**53,
            2.0**53 + 2,
            1e22,
            123456789.125,
            math.nan,
            math.inf,
            -math.inf,
        ]
    ),
)
_ints = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([2**63 - 1, 2**63, -(2**63) + 1, -(2**63), 2**64]),
    # 4300 digits (the limit) and 4301 (refused); built late: their repr is too long
    st.sampled_from([4299, 4300]).map(lambda n: -(10**n) if n % 2 else 10**n),
)
_texts = st.one_of(
    st.text(max_size=8),
    st.text(st.characters(codec=None), max_size=4),  # lone surrogates too
    st.text(st.characters(min_codepoint=0x80), max_size=4),  # non-ASCII, astral too
    st.sampled_from(["", "$", "$x", "$$x", "null", "1", '"$', 'a"$b', "\\", "\x00", "é"]),
)
_str_keys = st.one_of(
    _texts,
    st.text(alphabet="aAzZ_0é\u00ff\u0100\uffff\U0001f600\U00010000", max_size=3),  # sort order
)
_any_keys = st.one_of(
    _str_keys, st.integers(), st.booleans(), st.none(), _floats, st.just(Level.LOW)
)
_leaves = st.one_of(
    st.none(),
    st.booleans(),
    _ints,
    _floats,
    _texts,
    st.sampled_from([Level.LOW, Colour.RED]),
)


def _containers(children: Any) -> Any:
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(_str_keys, children, max_size=4),
        st.dictionaries(_str_keys, children, max_size=3).map(collections.OrderedDict),
        st.dictionaries(_any_keys, children, max_size=3),
    )


_json_like = st.recursive(_leaves, _containers, max_leaves=25)


def _nest(depth: int, kinds: list[str], leaf: Any) -> Any:
    value = leaf
    for i in range(depth):
        kind = kinds[i % len(kinds)]
        value = [value] if kind == "list" else (value,) if kind == "tuple" else {"k": value}
    return value


_deep = st.builds(
    _nest,
    st.integers(min_value=MAX_DEPTH - 3, max_value=MAX_DEPTH + 3),
    st.lists(st.sampled_from(["list", "tuple", "dict"]), min_size=1, max_size=3),
    _leaves,
)


def _outcome(payload: Any) -> tuple[str, Any]:
    try:
        return "ok", canonical.canonical_json(payload)
    except InvalidPayload:
        return "refused", None


def _slow(payload: Any) -> tuple[str, Any]:
    try:
        return "ok", canonical._slow(payload)
    except InvalidPayload:
        return "refused", None


def _check(payload: Any) -> None:
    assert _outcome(payload) == _slow(payload)
    try:
        fast = canonical._fast(payload)
    except UnicodeEncodeError:
        return  # canonical_json refuses it, as the walk does (compared above)
    if fast is not None:
        assert fast == canonical._slow(payload)


@settings(max_examples=1500, deadline=None)
@given(_json_like)
def test_nested_fast_path_writes_the_walks_bytes(payload: Any) -> None:
    """Nested JSON-like payloads: the same bytes (or the same refusal) either way."""
    _check(payload)


@settings(max_examples=200, deadline=None)
@given(_deep)
def test_nested_fast_path_keeps_the_depth_limit(payload: Any) -> None:
    """Around MAX_DEPTH, the fast path refuses nothing the walk accepts and the reverse."""
    _check(payload)


_ORDER = {
    "id": "ord-1",
    "amount": 1299,
    "currency": "EUR",
    "customer": {"id": "c-42", "email": "a@example.com", "name": "Zoë"},
    "items": [{"sku": "A-1", "qty": 2, "price": 4.5}, {"sku": "B-7", "qty": 1, "price": 3.99}],
    "tags": ("gift", "eu"),
    "note": None,
    "gift": False,
}


@pytest.mark.parametrize(
    "payload",
    [{"order": _ORDER}, [_ORDER, _ORDER], _nest(MAX_DEPTH - 1, ["list", "dict"], 1), {}, [], ()],
)
def test_nested_fast_path_is_taken(payload: Any) -> None:
    """Nested call arguments take the fast path (it is not silently skipped)."""
    fast = canonical._fast(payload)
    assert fast is not None
    assert fast == canonical._slow(payload)


@pytest.mark.parametrize(
    "payload",
    [
        {"a": {"$ref": 1}},  # escaped by the walk
        {"a": [1.0]},  # an integral float: written as an int by the walk
        {"a": -0.0},
        {"a": 1e16},
        {"a": (2**63,)},
        {1: "x"},  # a non-str key: a tagged map
        {"a": Level.LOW},
        {"a": collections.OrderedDict(b=1)},
        _nest(MAX_DEPTH + 1, ["list"], 1),
    ],
)
def test_nested_fast_path_leaves_the_rest_to_the_walk(payload: Any) -> None:
    """What the C encoder would write otherwise goes to the general walk."""
    assert canonical._fast(payload) is None
    assert _outcome(payload) == _slow(payload)


def test_circular_payload_is_refused() -> None:
    """A payload that contains itself is refused, not looped on by the fast path."""
    loop: list[Any] = []
    loop.append(loop)
    assert canonical._fast({"a": loop}) is None
    with pytest.raises(InvalidPayload):
        canonical.canonical_json({"a": loop})
