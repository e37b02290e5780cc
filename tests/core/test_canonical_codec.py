# SPDX-License-Identifier: MIT
"""Canonical JSON, fingerprints and the result codec (never pickle)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import uuid
from decimal import Decimal
from typing import Any

import pytest

import onceonly
from onceonly._core import codec, error_text
from onceonly._core.canonical import canonical_json
from onceonly._core.fingerprint import fingerprint


@dataclasses.dataclass(frozen=True)
class Item:
    sku: str
    qty: int


@dataclasses.dataclass(frozen=True)
class Address:
    city: str
    zip: str


@dataclasses.dataclass(frozen=True)
class Order:
    id: str
    ship_to: Address
    items: list[Item]
    tags: tuple[str, ...] = ()
    note: str | None = None


ORDER = Order("o-1", Address("Lyon", "69001"), [Item("a", 1), Item("b", 2)], ("gift", "rush"), None)


class Boom(Exception):
    pass


class NeedsTwo(Exception):
    def __init__(self, a: str, b: str) -> None:
        super().__init__(a, b)


# -- canonical_json


def test_canonical_json_sorts_keys_and_strips_whitespace() -> None:
    """Mapping keys are sorted at every depth and no whitespace is emitted."""
    got = canonical_json({"b": 1, "a": {"d": [1, 2], "c": None}})
    assert got == b'{"a":{"c":null,"d":[1,2]},"b":1}'


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, b"1"),
        (-0.0, b"0"),
        (2.5, b"2.5"),
        (Decimal("3.00"), b"3"),
        (Decimal("0.5"), b"0.5"),
        (True, b"true"),
        (None, b"null"),
        ((1, 2), b"[1,2]"),
        (["é"], '["é"]'.encode()),
        (dt.date(2024, 5, 1), b'"2024-05-01"'),
        (uuid.UUID(int=1), b'"00000000-0000-0000-0000-000000000001"'),
        ({1: "x"}, b'{"$map":[[1,"x"]]}'),
        (bytearray(b"\xff\x00"), b'{"$bytes":"/wA="}'),
    ],
)
def test_canonical_json_normalises(value: Any, expected: bytes) -> None:
    """Numbers, tuples, dates, UUIDs, non-str keys and bytes have one canonical form."""
    assert canonical_json(value) == expected


def test_canonical_json_parses_json_text() -> None:
    """JSON text (str or bytes) is compared by meaning, not by its spelling."""
    want = canonical_json({"a": 1, "b": 2})
    assert canonical_json('{ "b" : 2.0, "a": 1 }') == want
    assert canonical_json(b'{"b":2,"a":1}') == want


def test_canonical_json_keeps_other_text_exact() -> None:
    """Text that is not JSON is wrapped, so it never equals a JSON value."""
    assert canonical_json("hello") == b'{"$text":"hello"}'
    assert canonical_json("hello") != canonical_json("hello ")
    assert canonical_json(b"\xff\xfe") == b'{"$bytes":"//4="}'


def test_canonical_json_dataclass_is_its_fields() -> None:
    """A dataclass is canonicalised as the mapping of its fields."""
    assert canonical_json(Item("a", 1)) == canonical_json({"qty": 1.0, "sku": "a"})


def test_canonical_json_fields_subset() -> None:
    """fields= keeps only the named top-level fields; missing ones count as null."""
    assert canonical_json({"a": 1, "b": 2, "c": 3}, fields=["c", "a"]) == b'{"a":1,"c":3}'
    assert canonical_json({"a": 1}, fields=["a", "z"]) == b'{"a":1,"z":null}'
    assert canonical_json(Item("a", 1), fields=["sku"]) == b'{"sku":"a"}'
    assert canonical_json('{"a": 1, "b": 2}', fields=["a"]) == b'{"a":1}'


def test_canonical_json_fields_needs_a_mapping() -> None:
    """fields= on a list payload is an EncodingError."""
    with pytest.raises(onceonly.EncodingError, match="mapping"):
        canonical_json([1, 2], fields=["a"])


@pytest.mark.parametrize(
    "value",
    [
        math.nan,
        math.inf,
        {"x": -math.inf},
        Decimal("NaN"),
        Decimal("Infinity"),
        object(),
        {"s": {1, 2}},
        [Boom()],
    ],
)
def test_canonical_json_rejects(value: Any) -> None:
    """Non-finite numbers and objects without a canonical form are EncodingErrors."""
    with pytest.raises(onceonly.EncodingError):
        canonical_json(value)


# -- fingerprint


def test_fingerprint_is_sha256_of_canonical_json() -> None:
    """The default fingerprint is '2:' + 64 hex characters; key order and 1 vs 1.0 do not count."""
    fp = fingerprint({"a": 1, "b": [1, 2]})
    assert fp.startswith("2:")
    assert len(fp) == 66
    assert fp == fingerprint({"b": [1.0, 2], "a": 1})
    assert fp != fingerprint({"a": 1, "b": [2, 1]})
    assert fp == "2:" + onceonly.content_key({"a": 1, "b": [1, 2]})


def test_fingerprint_fields() -> None:
    """fields= fingerprints only those fields."""
    a = {"id": 1, "amount": 5, "trace": "x"}
    b = {"id": 1, "amount": 5, "trace": "y"}
    assert fingerprint(a) != fingerprint(b)
    assert fingerprint(a, fields=["id", "amount"]) == fingerprint(b, fields=["id", "amount"])
    assert fingerprint(a, fields=["id", "amount"]) != fingerprint(
        {"id": 1, "amount": 6}, fields=["id", "amount"]
    )


def test_fingerprint_custom_text() -> None:
    """custom= returning text fingerprints that text, in its own namespace."""

    def by_id(payload: Any) -> str:
        return str(payload["id"])

    a = fingerprint({"id": 1, "x": 1}, custom=by_id)
    assert a == fingerprint({"id": 1, "x": 2}, custom=by_id)
    assert a != fingerprint({"id": 2, "x": 1}, custom=by_id)
    assert a.startswith("c:")
    assert a != fingerprint({"id": 1, "x": 1})


def test_fingerprint_custom_value() -> None:
    """custom= returning a non-str value fingerprints its canonical JSON."""

    def pick(payload: Any) -> Any:
        return {"id": payload["id"], "n": payload["n"]}

    assert fingerprint({"id": 1, "n": 1.0, "x": 0}, custom=pick) == fingerprint(
        {"n": 1, "id": 1, "x": 9}, custom=pick
    )
    assert fingerprint({"id": 1, "n": 1}, custom=pick) != fingerprint(
        {"id": 1, "n": 2}, custom=pick
    )


def test_fingerprint_unfingerprintable_payload() -> None:
    """A payload with no canonical form is an EncodingError that suggests a way out."""
    with pytest.raises(onceonly.EncodingError, match="fingerprint="):
        fingerprint(object())


# -- encode / decode


def test_encode_is_compact_json() -> None:
    """encode() gives compact JSON text, keys in insertion order."""
    assert codec.encode({"b": 1, "a": [1, "x", None, True]}) == '{"b":1,"a":[1,"x",null,true]}'


def test_dataclass_round_trip() -> None:
    """A dataclass with a nested dataclass and list[dataclass] is rebuilt via result_type."""
    text = codec.encode(ORDER)
    assert codec.decode(text) == {  # no type: the mapping of its fields
        "id": "o-1",
        "ship_to": {"city": "Lyon", "zip": "69001"},
        "items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 2}],
        "tags": ("gift", "rush"),
        "note": None,
    }
    back = codec.decode(text, Order)
    assert back == ORDER
    assert isinstance(back.ship_to, Address)
    assert all(isinstance(i, Item) for i in back.items)
    assert back.tags == ("gift", "rush")


def test_decode_list_of_dataclasses() -> None:
    """result_type=list[Item] rebuilds every element."""
    text = codec.encode([Item("a", 1), Item("b", 2)])
    assert codec.decode(text, list[Item]) == [Item("a", 1), Item("b", 2)]


def test_decode_ignores_unknown_fields() -> None:
    """Stored fields the dataclass no longer has are dropped; defaults fill missing ones."""
    text = '{"id":"o","ship_to":{"city":"c","zip":"z"},"items":[],"removed":1}'
    assert codec.decode(text, Order) == Order("o", Address("c", "z"), [])


def test_decode_none_and_plain_types() -> None:
    """null decodes to None whatever the type; non-dataclass types pass through."""
    assert codec.decode("null", Order) is None
    assert codec.decode('{"a":1}', dict) == {"a": 1}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({3, 1, 2}, "[1,2,3]"),
        (frozenset({"b", "a"}), '["a","b"]'),
        (Decimal("1.10"), '"1.10"'),
        (dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc), '"2024-05-01T12:00:00+00:00"'),
        (uuid.UUID(int=0), '"00000000-0000-0000-0000-000000000000"'),
        ((1, 2), "[1,2]"),
    ],
)
def test_encode_extra_types_as_plain_json(value: Any, expected: str) -> None:
    """Payloads: sets (sorted), Decimals (as text), datetimes and UUIDs as plain JSON."""
    assert codec.encode(value, what="payload") == expected


@pytest.mark.parametrize("typed", [True, False], ids=["result", "payload"])
@pytest.mark.parametrize("value", [object(), {"x": object()}, Boom("x"), math.nan, [math.inf]])
def test_encode_rejects(value: Any, typed: bool) -> None:
    """Objects JSON cannot hold and NaN/inf are EncodingErrors (TypeErrors)."""
    with pytest.raises(onceonly.EncodingError, match="cannot be stored as JSON") as info:
        codec.encode(value, typed=typed)
    assert isinstance(info.value, TypeError)


@pytest.mark.parametrize("value", [{1, "a"}, b"bytes"])
def test_plain_encoding_rejects_unsortable_sets_and_bytes(value: Any) -> None:
    """Payloads stay plain JSON: no bytes, and sets must sort (results keep both)."""
    with pytest.raises(onceonly.EncodingError, match="cannot be stored as JSON"):
        codec.encode(value, what="payload")
    assert codec.decode(codec.encode(value)) == value


def test_encode_names_what() -> None:
    """The error names what was being encoded."""
    with pytest.raises(onceonly.EncodingError, match="the checkpoint"):
        codec.encode(object(), what="checkpoint")
    with pytest.raises(onceonly.TooLarge, match="payload"):
        codec.encode("xx", max_bytes=1, what="payload")


def test_encode_limit_is_inclusive() -> None:
    """Exactly max_bytes is accepted; one byte more is TooLarge."""
    assert codec.encode("x" * 8, max_bytes=10) == '"' + "x" * 8 + '"'
    with pytest.raises(onceonly.TooLarge, match="11 bytes; the limit is 10"):
        codec.encode("x" * 9, max_bytes=10)


def test_encode_limit_counts_utf8_bytes() -> None:
    """The limit is measured on the UTF-8 encoding, not in characters."""
    text = codec.encode("é")
    size = len(text.encode("utf-8"))
    assert codec.encode("é", max_bytes=size) == text
    with pytest.raises(onceonly.TooLarge):
        codec.encode("é", max_bytes=size - 1)


def test_default_limit_is_one_mebibyte() -> None:
    """By default 1 MiB of encoded result is accepted and a byte more is not."""
    assert codec.DEFAULT_MAX_BYTES == 1024 * 1024
    fits = "x" * (1024 * 1024 - 2)  # plus two quotes
    assert len(codec.encode(fits)) == 1024 * 1024
    with pytest.raises(onceonly.TooLarge):
        codec.encode(fits + "x")


# -- errors


def test_encode_error_round_trip() -> None:
    """A cached error is rebuilt as its class with its arguments."""
    text = error_text.encode_error(Boom("card declined", 402))
    assert json.loads(text) == {"type": f"{__name__}.Boom", "args": ["card declined", 402]}
    back = error_text.decode_error(text, (KeyError, Boom))
    assert isinstance(back, Boom)
    assert back.args == ("card declined", 402)


def test_encode_error_stringifies_non_json_args() -> None:
    """Arguments JSON cannot hold are stored as their repr() (here the same as str())."""
    text = error_text.encode_error(ValueError(object, {1, 2}))
    assert json.loads(text)["args"] == [str(object), str({1, 2})]


def test_decode_error_unknown_class() -> None:
    """A class outside the candidates is not rebuilt (no arbitrary imports)."""
    text = error_text.encode_error(Boom("x"))
    assert error_text.decode_error(text, (KeyError, ValueError)) is None
    assert error_text.decode_error(text, ()) is None


def test_decode_error_that_cannot_be_rebuilt() -> None:
    """A candidate whose constructor rejects the stored arguments gives None."""
    text = json.dumps({"type": f"{__name__}.NeedsTwo", "args": ["only-one"]})
    assert error_text.decode_error(text, (NeedsTwo,)) is None


def test_error_summary() -> None:
    """The summary is 'Class: message', cut to the limit with an ellipsis."""
    assert error_text.error_summary(Boom("card declined")) == "Boom: card declined"
    long = error_text.error_summary(ValueError("x" * 5000))
    assert len(long) == 2000
    assert long.startswith("ValueError: xxx")
    assert long.endswith("…")
    assert error_text.error_summary(ValueError("y" * 10), limit=14) == "ValueError: y…"
    assert error_text.error_summary(ValueError("y"), limit=13) == "ValueError: y"
