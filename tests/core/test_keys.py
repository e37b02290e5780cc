# SPDX-License-Identifier: MIT
"""Key validation and the key builders: content, composite, time window, UUIDv7."""

from __future__ import annotations

import datetime as dt
import time
import urllib.parse
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

import onceonly


@pytest.mark.parametrize("key", [b"abc", 12, None, 1.5, ["a"]])
def test_validate_key_rejects_non_str(key: object) -> None:
    """A key that is not a str is InvalidKey (a ValueError)."""
    with pytest.raises(onceonly.InvalidKey, match="must be a str"):
        onceonly.validate_key(key)


def test_validate_key_rejects_empty() -> None:
    """The empty key is invalid."""
    with pytest.raises(onceonly.InvalidKey, match="empty"):
        onceonly.validate_key("")


def test_validate_key_length_limit() -> None:
    """255 characters are accepted, 256 are not."""
    assert onceonly.validate_key("k" * 255) == "k" * 255
    with pytest.raises(onceonly.InvalidKey, match="256 characters"):
        onceonly.validate_key("k" * 256)


def test_validate_key_counts_characters_not_bytes() -> None:
    """The limit is in characters: 255 four-byte characters are fine."""
    key = "🔑" * 255
    assert onceonly.validate_key(key) == key


@pytest.mark.parametrize("ch", ["\x00", "\n", "\x1f", "\x7f", "\x85", "\x9f"])
def test_validate_key_rejects_control_characters(ch: str) -> None:
    """C0 controls, DEL and C1 controls are rejected anywhere in the key."""
    for key in (f"{ch}abc", f"ab{ch}c", f"abc{ch}"):
        with pytest.raises(onceonly.InvalidKey, match="control character"):
            onceonly.validate_key(key)


@pytest.mark.parametrize("key", ["a", "order:42", "ключ-🔑", "a b", "x\xa0y", "ø" * 10, "%3A"])
def test_validate_key_accepts(key: str) -> None:
    """Printable keys, unicode and spaces included, are returned unchanged."""
    assert onceonly.validate_key(key) == key


def test_validate_key_names_what_is_validated() -> None:
    """The message names the thing validated (``what=``)."""
    with pytest.raises(onceonly.InvalidKey, match="consumer must not be empty"):
        onceonly.validate_key("", what="consumer")


def test_content_key_shape() -> None:
    """A content key is 64 lowercase hex characters, and a valid key."""
    key = onceonly.content_key({"a": 1})
    assert len(key) == 64
    assert set(key) <= set("0123456789abcdef")
    assert onceonly.validate_key(key) == key


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}),
        ('{"a": 1,  "b": [1, 2]}', '{"b":[1,2],"a":1}'),
        (b'{"a": 1}', {"a": 1}),
        ({"n": 1}, {"n": 1.0}),
        ([1, 2.0], (1.0, 2)),
        ({"nested": {"y": 2, "x": 1}}, {"nested": {"x": 1.0, "y": 2}}),
    ],
)
def test_content_key_same_meaning_same_key(left: object, right: object) -> None:
    """Key order, whitespace in JSON text and 1 vs 1.0 give the same key."""
    assert onceonly.content_key(left) == onceonly.content_key(right)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({"a": 1}, {"a": 2}),
        ({"a": 1}, {"b": 1}),
        ({"a": 1}, {"a": "1"}),
        ({"a": True}, {"a": 1}),
        ({"a": None}, {}),
        ([1, 2], [2, 1]),
        ({"a": 1.5}, {"a": 1}),
    ],
)
def test_content_key_different_values_differ(left: object, right: object) -> None:
    """Payloads that mean different things get different keys."""
    assert onceonly.content_key(left) != onceonly.content_key(right)


def test_content_key_fields_subset() -> None:
    """With fields=, only those fields count; a missing one counts as null."""
    a = {"id": 7, "amount": 5, "received_at": "10:00"}
    b = {"amount": 5, "id": 7, "received_at": "10:05"}
    assert onceonly.content_key(a) != onceonly.content_key(b)
    assert onceonly.content_key(a, fields=["id", "amount"]) == onceonly.content_key(
        b, fields=["id", "amount"]
    )
    assert onceonly.content_key(a, fields=["id"]) != onceonly.content_key({"id": 8}, fields=["id"])
    assert onceonly.content_key({"id": 7}, fields=["id", "x"]) == onceonly.content_key(
        {"id": 7, "x": None}, fields=["id", "x"]
    )


def test_composite_key_is_injective_on_colons() -> None:
    """Parts containing ':' never collide with another split of the same text."""
    left = onceonly.composite_key("a:b", "c")
    right = onceonly.composite_key("a", "b:c")
    assert left != right
    assert left == "a%3Ab:c"
    assert right == "a:b%3Ac"


def test_composite_key_escapes_percent() -> None:
    """A literal '%3A' in a part is escaped so it cannot pose as an escaped ':'."""
    assert onceonly.composite_key("a%3Ab", "c") != onceonly.composite_key("a:b", "c")
    assert onceonly.composite_key("100%") == "100%25"


def test_composite_key_ints() -> None:
    """int parts are written in decimal."""
    assert onceonly.composite_key("order", 42, -1) == "order:42:-1"


@given(
    st.lists(
        st.text(alphabet=st.sampled_from("ab:%3A5 é"), min_size=1, max_size=6),
        min_size=1,
        max_size=5,
    )
)
def test_composite_key_round_trips(parts: list[str]) -> None:
    """Splitting on ':' and percent-decoding gives the parts back exactly."""
    key = onceonly.composite_key(*parts)
    assert [urllib.parse.unquote(p) for p in key.split(":")] == parts


@pytest.mark.parametrize(
    "parts",
    [(), ("",), ("a", ""), ("", "b"), ("a", True), (False,), ("a", None), ("a", float("nan"))],
)
def test_composite_key_rejects(parts: tuple[object, ...]) -> None:
    """No parts, an empty part, a bool, None or a non-finite number is InvalidKey."""
    with pytest.raises(onceonly.InvalidKey):
        onceonly.composite_key(*parts)


def test_composite_key_result_is_validated() -> None:
    """A composite key that would be too long or hold control characters is rejected."""
    with pytest.raises(onceonly.InvalidKey):
        onceonly.composite_key("a" * 200, "b" * 60)
    with pytest.raises(onceonly.InvalidKey):
        onceonly.composite_key("a\x00", "b")


def test_time_window_key_same_window_same_key() -> None:
    """Two instants in the same window give the same key."""
    assert onceonly.time_window_key("digest", 60, at=120.0) == onceonly.time_window_key(
        "digest", 60, at=179.999
    )


def test_time_window_key_next_window_differs() -> None:
    """The first instant of the next window gives another key."""
    assert onceonly.time_window_key("digest", 60, at=179.0) != onceonly.time_window_key(
        "digest", 60, at=180.0
    )


def test_time_window_key_other_base_differs() -> None:
    """Another base gives another key in the same window."""
    assert onceonly.time_window_key("a", 60, at=1.0) != onceonly.time_window_key("b", 60, at=1.0)


def test_time_window_key_accepts_timedelta_float_and_datetime() -> None:
    """timedelta and float windows, datetime and float instants agree."""
    at = dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.timezone.utc)
    by_timedelta = onceonly.time_window_key("d", dt.timedelta(hours=1), at=at)
    assert by_timedelta == onceonly.time_window_key("d", 3600.0, at=at.timestamp())
    assert by_timedelta == onceonly.time_window_key("d", 3600, at=at.timestamp() + 1799)
    assert by_timedelta != onceonly.time_window_key("d", 3600.0, at=at.timestamp() + 1800)
    assert onceonly.validate_key(by_timedelta) == by_timedelta


def test_time_window_key_defaults_to_now() -> None:
    """Without at=, the current window is used."""
    before = time.time()
    key = onceonly.time_window_key("d", 86_400)
    after = time.time()
    candidates = {onceonly.time_window_key("d", 86_400, at=t) for t in (before, after)}
    assert key in candidates


@pytest.mark.parametrize("window", [0, -5, dt.timedelta(0)])
def test_time_window_key_rejects_non_positive_window(window: float | dt.timedelta) -> None:
    """A window must be positive."""
    with pytest.raises(onceonly.InvalidKey):
        onceonly.time_window_key("d", window, at=1.0)


def test_time_window_key_rejects_invalid_base() -> None:
    """The base is validated like a key."""
    with pytest.raises(onceonly.InvalidKey):
        onceonly.time_window_key("", 60, at=1.0)


def test_uuid7_version_and_variant() -> None:
    """uuid7() is an RFC 9562 version 7 UUID."""
    value = uuid.UUID(onceonly.uuid7())
    assert value.version == 7
    assert value.variant == uuid.RFC_4122


def test_uuid7_carries_the_unix_milliseconds() -> None:
    """The first 48 bits are the current Unix time in milliseconds."""
    before = time.time_ns() // 1_000_000
    value = uuid.UUID(onceonly.uuid7())
    after = time.time_ns() // 1_000_000
    assert before <= value.int >> 80 <= after


def test_uuid7_is_time_ordered() -> None:
    """UUIDs made in later milliseconds sort after earlier ones, as text and as ints."""
    made = []
    for _ in range(5):
        made.append(onceonly.uuid7())
        time.sleep(0.002)
    assert made == sorted(made)
    assert [uuid.UUID(u).int for u in made] == sorted(uuid.UUID(u).int for u in made)


def test_uuid7_is_unique() -> None:
    """10,000 calls give 10,000 distinct valid keys."""
    made = {onceonly.uuid7() for _ in range(10_000)}
    assert len(made) == 10_000
    key = next(iter(made))
    assert onceonly.validate_key(key) == key
    assert len(key) == 36


def test_uuid7_is_strictly_increasing_within_a_process() -> None:
    """Ids made in a burst (many per millisecond) sort in the order they were made."""
    ids = [onceonly.uuid7() for _ in range(5000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
