# SPDX-License-Identifier: MIT
"""The fast paths of the hot functions give exactly what the general code gives.

Canonical JSON is part of the fingerprint contract (spec §2.2): a fast path that wrote
one payload differently would turn a redelivery into a PayloadMismatch. Each fast path
is compared with the general walk over generated inputs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import inspect
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceonly._core import canonical, codec
from onceonly._core.keys import MAX_KEY_LENGTH, validate_key
from onceonly._core.state import Record, Write
from onceonly._runtime import new_token
from onceonly.errors import EncodingError, InvalidKey, InvalidPayload, TooLarge
from onceonly.inbox._outcome import Outcome
from onceonly.types import Snapshot


class Level(enum.IntEnum):
    LOW = 1


# Text that reaches both branches of the str fast path: JSON-looking or not.
_texts = st.one_of(
    st.text(),
    st.text(alphabet=' \t\n\r{}[]":,-0123456789.eEtruefalsnNI$\\', max_size=12),
    st.sampled_from(["", " 1", "null", "NaN", "-Infinity", "\ufeff{}", "tru", "k1-ab", "$x"]),
    st.text(st.characters(codec=None), max_size=5),  # lone surrogates too
)
_keys = st.one_of(st.text(max_size=6), st.sampled_from(["$", "$x", "$$x", "a", "b"]))
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1e6, max_value=1e6).map(lambda f: float(round(f))),  # integral
    _texts,
    st.just(Level.LOW),
)
_payloads = st.one_of(
    _scalars,
    st.dictionaries(_keys, _scalars, max_size=6),
    st.dictionaries(st.one_of(_keys, st.integers()), _scalars, max_size=3),
    st.dictionaries(_keys, st.one_of(_scalars, st.lists(_scalars, max_size=2)), max_size=3),
    st.lists(_scalars, max_size=3),
)


def _outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except (InvalidPayload, EncodingError) as exc:
        return "refused", type(exc)


@settings(max_examples=600, deadline=None)
@given(_payloads)
def test_canonical_fast_path_is_the_slow_path(payload: Any) -> None:
    """canonical_json (fast path first) == the general walk, bytes or refusal."""
    assert _outcome(canonical.canonical_json, payload) == _outcome(canonical._slow, payload)
    try:
        fast = canonical._fast(payload)
    except UnicodeEncodeError:
        return  # refused by canonical_json, as by the slow path (compared above)
    if fast is not None:
        assert fast == canonical._slow(payload)


@pytest.mark.parametrize(
    "payload",
    ["k1-abcd", "", "ünïcode", 7, -(2**62), True, None, {"id": "x", "n": 1, "f": 0.5, "ok": None}],
)
def test_canonical_fast_path_covers_common_payloads(payload: Any) -> None:
    """The fast path is taken for plain text, ints and flat dicts (not silently skipped)."""
    assert canonical._fast(payload) == canonical._slow(payload)


@pytest.mark.parametrize("case", range(4))
def test_canonical_fast_path_keeps_the_limits(case: int) -> None:
    """Big integers are left to the slow path, which refuses past MAX_INT_DIGITS."""
    payload = [10**4300, -(10**4300), {"n": 10**4300}, {"n": 2**64}][case]
    assert _outcome(canonical.canonical_json, payload) == _outcome(canonical._slow, payload)


@settings(max_examples=600, deadline=None)
@given(_payloads)
def test_codec_fast_path_is_the_general_encoding(value: Any) -> None:
    """A value the codec writes directly is written exactly as its walks write it."""
    if not codec._flat(value):
        return
    direct = codec.encode(value)
    assert direct == codec._typed(value, "result")
    assert codec.encode(value, what="payload") == codec._plain(value)
    assert codec.decode(direct) == value


def test_codec_none_shortcut_respects_the_bound() -> None:
    """A None result is "null", and still too large for a bound under 4 bytes."""
    assert codec.encode(None) == "null"
    with pytest.raises(TooLarge):
        codec.encode(None, max_bytes=3)


def _valid_key(key: str) -> bool:
    return 0 < len(key) <= MAX_KEY_LENGTH and not any(
        ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF for c in key
    )


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.text(st.characters(codec=None), max_size=8),
        st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0xA0), max_size=8),
        st.text(min_size=250, max_size=260, alphabet="ab"),
    )
)
def test_validate_key_fast_path_keeps_the_rule(key: str) -> None:
    """Keys are accepted exactly when the spec's rule says so, fast path or not."""
    if _valid_key(key):
        assert validate_key(key) == key
    else:
        with pytest.raises(InvalidKey):
            validate_key(key)


def test_tokens_are_63_bit_and_distinct() -> None:
    """Tokens are positive 63-bit numbers, never repeated (more than one bulk read)."""
    tokens = [new_token() for _ in range(5000)]
    assert len(set(tokens)) == len(tokens)
    assert all(0 < t < 2**63 for t in tokens)


_FORK_CHECK = """
import os
from onceonly.inbox._outcome import Outcome
from onceonly._runtime import new_token
from onceonly.types import Snapshot
new_token()  # the buffer now holds tokens a child would inherit
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(write, " ".join(str(new_token()) for _ in range(8)).encode())
    os._exit(0)
os.waitpid(pid, 0)
theirs = set(os.read(read, 4096).split())
ours = {str(new_token()).encode() for _ in range(8)}
print(len(theirs), len(ours & theirs))
"""


def test_a_forked_child_draws_other_tokens() -> None:
    """A forked child does not hand out the tokens left in its parent's buffer."""
    # in a fresh single-threaded interpreter: forking a threaded one is unsafe
    out = subprocess.run(
        [sys.executable, "-c", _FORK_CHECK], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["8", "0"]


@pytest.mark.parametrize("cls", [Record, Write, Snapshot, Outcome])
def test_one_step_init_is_the_dataclass_init(cls: Any) -> None:
    """Record, Write, Snapshot and Outcome take the dataclass's parameters and defaults,
    and stay frozen, comparable and replaceable."""
    fields = dataclasses.fields(cls)
    twin = dataclasses.make_dataclass("Twin", [(f.name, f.type, f) for f in fields], frozen=True)
    assert list(inspect.signature(cls).parameters.values()) == list(
        inspect.signature(twin).parameters.values()
    )
    required = {f.name: f"v-{f.name}" for f in fields if f.default is dataclasses.MISSING}
    assert vars(cls(**required)) == vars(twin(**required))  # the defaults
    values = {f.name: f"v-{f.name}" for f in fields}
    made = cls(**values)
    assert vars(made) == vars(twin(**values)) == values
    assert made == cls(*values.values()) and hash(made) == hash(cls(**values))
    first = fields[0].name
    assert getattr(dataclasses.replace(made, **{first: 7}), first) == 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, first, 8)


_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text()),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=400, deadline=None)
@given(
    _json_values,
    st.sampled_from(["", " ", "\n"]),
    st.sampled_from(["", " ", "\t\n", "x", "]", ' {"a":1}']),
)
def test_codec_decode_shortcut_is_json_loads(value: Any, before: str, after: str) -> None:
    """Decoding a plain stored result reads what json.loads reads, and refuses what it
    refuses (surrounding whitespace, trailing text)."""
    import json

    text = before + json.dumps(value, separators=(",", ":")) + after
    try:
        expected: tuple[str, Any] = ("ok", json.loads(text))
    except ValueError:
        expected = ("refused", None)
    try:
        got: tuple[str, Any] = ("ok", codec.decode(text))
    except EncodingError:
        got = ("refused", None)
    assert got == expected


_HINTS: list[Any] = [
    None,
    Any,
    object,
    dict,
    list,
    dict[str, Any],
    list[Any],
    dict[str, list[Any]],
    dict[str, dict[str, Any]],
    list[dict[str, Any]],
    # not plain: the Decoder may rebuild these, so they keep the full path
    dict[str, int],
    dict[int, Any],
    list[int],
    tuple[Any, ...],
    set[Any],
    str,
    int,
    float,
    dict[str, dt.datetime],
    list[dt.date] | None,
]


@settings(max_examples=600, deadline=None)
@given(
    st.one_of(
        _json_values,
        st.integers(min_value=95, max_value=110).map(lambda n: _nested_list(n)),
    ),
    st.sampled_from(_HINTS),
)
def test_codec_decode_plain_hints_skip_nothing(value: Any, hint: Any) -> None:
    """A plain stored result decoded under a hint: what the Decoder gives (or the same
    refusal, past its depth limit), whether the hint takes the shortcut or not."""
    import json

    from onceonly._core.rebuild import Decoder

    text = json.dumps(value, separators=(",", ":"))
    try:
        node = json.loads(text)
        # without a hint, plain JSON was always returned as parsed (no Decoder)
        rebuilt = node if hint is None else Decoder(legacy=True).decode(node, hint, 0)
        expected: tuple[str, Any] = ("ok", rebuilt)
    except EncodingError:
        expected = ("refused", None)
    try:
        got: tuple[str, Any] = ("ok", codec.decode(text, hint))
    except EncodingError:
        got = ("refused", None)
    assert got == expected
    assert type(got[1]) is type(expected[1])


def _nested_list(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_plain_hints_are_told_apart() -> None:
    """The shortcut is taken for JSON-shaped hints only."""
    from onceonly._core.rebuild import plain_hint

    assert all(plain_hint(h) for h in _HINTS[:10])
    assert not any(plain_hint(h) for h in _HINTS[10:])
