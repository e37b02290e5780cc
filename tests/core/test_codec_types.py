# SPDX-License-Identifier: MIT
"""The result codec preserves types: a replay returns what the first run returned."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import math
import uuid
import zoneinfo
from decimal import Decimal
from typing import Any, NamedTuple, Optional, Union

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import onceonly
from onceonly._core import codec
from onceonly._core.state import Record, State
from onceonly.inbox._outcome import replayed_result
from tests._ids import stable_repr

UTC = dt.timezone.utc
PLUS_0530 = dt.timezone(dt.timedelta(hours=5, minutes=30))


def assert_same(a: Any, b: Any, path: str = "value") -> None:
    """``a == b`` and every part has the same type (dict keys and set members included)."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, float):
        assert repr(a) == repr(b), path  # -0.0 and 0.0 differ
    elif isinstance(a, Decimal):
        assert str(a) == str(b), path  # Decimal('1.0') and Decimal('1.00') differ
    elif isinstance(a, (dt.datetime, dt.time)):
        assert a == b, path
        assert a.utcoffset() == b.utcoffset(), path
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert a == b, path
        b_keys = {k: k for k in b}
        for k, v in a.items():
            assert_same(k, b_keys[k], f"{path} key {k!r}")
            assert_same(v, b[k], f"{path}[{k!r}]")
    elif isinstance(a, (set, frozenset)):
        assert a == b, path
        b_members = {m: m for m in b}
        for m in a:
            assert_same(m, b_members[m], f"{path} member {m!r}")
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    else:
        assert a == b, path


def round_trip(value: Any, result_type: Any = None) -> Any:
    return codec.decode(codec.encode(value), result_type)


@pytest.mark.parametrize(
    "value",
    [
        dt.datetime(2024, 5, 1, 12, 30, 15, 123456),
        dt.datetime(2024, 5, 1, 12, 30, tzinfo=UTC),
        dt.datetime(2024, 5, 1, 12, 30, tzinfo=PLUS_0530),
        dt.date(2024, 2, 29),
        dt.time(23, 59, 59, 999999),
        dt.time(8, 0, tzinfo=PLUS_0530),
        dt.timedelta(days=-3, seconds=5, microseconds=7),
        Decimal("1.10"),
        Decimal("-0"),
        Decimal("1E+999999999"),
        Decimal("Infinity"),
        uuid.UUID(int=2**128 - 1),
        (1, "a", None),
        (),
        ((1, 2), [3, (4,)]),
        {1, 2, 3},
        frozenset({"a", "b"}),
        {1, "a", (2, 3), None},
        set(),
        b"\x00\x01\xff",
        bytearray(b"xyz"),
        {1: "int key", 2.5: "float key", None: "none", (1, 2): "tuple"},
        {True: "bool", "True": "text", 0.5: 1},
        {"None": 1, None: 2},
        {dt.date(2024, 1, 1): Decimal("3.5")},
        {frozenset({1}): "frozen"},
        -0.0,
        10**300,
        "text with \x00 and \ud800",
    ],
    ids=stable_repr,
)
def test_round_trip_preserves_type(value: Any) -> None:
    """datetime, Decimal, UUID, tuple, set, bytes and non-text keys come back as themselves."""
    assert_same(value, round_trip(value))


@pytest.mark.parametrize(
    "value",
    [
        {"$datetime": "2024-05-01T00:00:00"},
        {"$tuple": [1, 2]},
        {"$bytes": "AAE="},
        {"$$tuple": 1, "$": 2, "$$": 3},
        {"$dict": [[1, 2]]},
        [{"$set": []}, dt.date(2024, 5, 1)],
        {"$x": {"$y": (1,)}},
    ],
    ids=stable_repr,
)
def test_user_data_that_looks_like_a_tag_round_trips(value: Any) -> None:
    """Mappings whose keys start with '$' are escaped, never mistaken for a tag."""
    assert_same(value, round_trip(value))


def test_zoneinfo_datetimes_keep_their_zone() -> None:
    """An aware datetime in a named zone comes back in that zone."""
    value = dt.datetime(2024, 10, 27, 2, 30, fold=1, tzinfo=zoneinfo.ZoneInfo("Europe/Paris"))
    back = round_trip(value)
    assert_same(value, back)
    assert back.tzinfo == zoneinfo.ZoneInfo("Europe/Paris")
    assert back.fold == 1


def test_plain_json_is_stored_as_plain_json() -> None:
    """Results that are plain JSON are stored exactly as before (no tags, no prefix)."""
    assert codec.encode({"a": [1, 2.5, "x", None, True]}) == '{"a":[1,2.5,"x",null,true]}'
    assert codec.encode({"$set": 1}) == '{"$set":1}'  # a "$" key alone needs no tags
    assert codec.decode('{"$set":1}') == {"$set": 1}


def test_tagged_results_say_so() -> None:
    """A result that needs tags is stored with the 'v2:' marker (never valid JSON)."""
    text = codec.encode({"at": dt.date(2024, 5, 1), "$k": 1})
    assert text == 'v2:{"at":{"$date":"2024-05-01"},"$$k":1}'
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


@pytest.mark.parametrize(
    "text",
    [
        '{"$bytes":"AAE="}',
        '{"$datetime":"2024-05-01T00:00:00"}',
        '{"$$x":1}',
        '["2024-05-01", "1.10"]',
        '"v2:not a tag"',
    ],
)
def test_old_plain_records_decode_as_before(text: str) -> None:
    """Results stored by the plain encoding decode to the same JSON value as before."""
    assert codec.decode(text) == json.loads(text)


def test_payloads_and_checkpoints_stay_plain_json() -> None:
    """Only results are tagged: payloads and checkpoints are JSON that others read."""
    value = {"at": dt.datetime(2024, 5, 1, tzinfo=UTC), "n": Decimal("1.5"), "s": (1, 2)}
    expected = '{"at":"2024-05-01T00:00:00+00:00","n":"1.5","s":[1,2]}'
    assert codec.encode(value, what="payload") == expected
    assert codec.encode(value, what="checkpoint") == expected
    assert codec.encode(value, typed=False) == expected
    assert codec.encode(value, what="payload", typed=True).startswith("v2:")


@pytest.mark.parametrize(
    "value",
    [
        math.nan,
        [math.inf],
        object(),
        {"x": object()},
        memoryview(b"x"),
        10**5000,
    ],
    ids=["nan", "inf", "object", "nested-object", "memoryview", "huge-int"],
)
def test_typed_encode_rejects(value: Any) -> None:
    """What cannot be rebuilt exactly is an EncodingError (a TypeError)."""
    with pytest.raises(onceonly.EncodingError, match="cannot be stored"):
        codec.encode(value)


def test_encode_rejects_deep_and_circular_results() -> None:
    """Circular and too-deep results are EncodingErrors, on both encodings."""
    loop: list[Any] = []
    loop.append(loop)
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    for typed in (True, False):
        with pytest.raises(onceonly.EncodingError):
            codec.encode(loop, typed=typed)
        with pytest.raises(onceonly.EncodingError):
            codec.encode(deep, typed=typed)


@pytest.mark.parametrize(
    "text",
    [
        "v2:{",
        'v2:{"$nope":1}',
        'v2:{"$tuple":1}',
        'v2:{"$dict":[[[1],2]]}',
        "{",
        "v2:" + "[" * 5000,
    ],
)
def test_decode_of_damaged_text_is_an_encoding_error(text: str) -> None:
    """Text that is not a valid encoding raises EncodingError, nothing else."""
    with pytest.raises(onceonly.EncodingError):
        codec.decode(text)


# -- result_type: dataclasses


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    price: Decimal


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Pair(NamedTuple):
    left: int
    right: str


@dataclasses.dataclass
class Invoice:
    id: uuid.UUID
    issued: dt.datetime
    due: dt.date
    total: Decimal
    lines: tuple[Line, ...]
    by_line: dict[int, Line]
    tags: frozenset[str]
    colour: Colour
    pair: Pair
    paid: Optional[dt.date] = None  # noqa: UP045 -- the Optional spelling must work too
    note: Union[str, None] = None  # noqa: UP007
    extra: list[Line] | None = None


INVOICE = Invoice(
    id=uuid.UUID(int=7),
    issued=dt.datetime(2024, 5, 1, 9, 0, tzinfo=UTC),
    due=dt.date(2024, 6, 1),
    total=Decimal("12.50"),
    lines=(Line("a", Decimal("10.00")), Line("b", Decimal("2.50"))),
    by_line={1: Line("a", Decimal("10.00"))},
    tags=frozenset({"x"}),
    colour=Colour.BLUE,
    pair=Pair(1, "r"),
    paid=dt.date(2024, 5, 2),
    extra=[Line("c", Decimal("0"))],
)


def test_dataclass_fields_are_rebuilt_with_their_types() -> None:
    """result_type=Dataclass rebuilds datetime, Decimal, UUID, nested and container fields."""
    back = round_trip(INVOICE, Invoice)
    assert_same(INVOICE, back)
    assert isinstance(back.colour, Colour)
    assert isinstance(back.pair, Pair)


def test_dataclass_from_an_old_plain_record() -> None:
    """A result stored by the plain encoding is rebuilt from its annotations."""
    old = json.dumps(
        {
            "id": str(INVOICE.id),
            "issued": INVOICE.issued.isoformat(),
            "due": "2024-06-01",
            "total": "12.50",
            "lines": [{"sku": "a", "price": "10.00"}, {"sku": "b", "price": "2.50"}],
            "by_line": {"1": {"sku": "a", "price": "10.00"}},
            "tags": ["x"],
            "colour": "blue",
            "pair": [1, "r"],
            "paid": "2024-05-02",
            "note": None,
            "extra": [{"sku": "c", "price": "0"}],
        }
    )
    assert_same(INVOICE, codec.decode(old, Invoice))


def test_annotations_do_not_change_typed_values() -> None:
    """A tagged record keeps the exact types stored, whatever a loose annotation says."""
    value = (1, "2024-05-01", [1, 2], "1.5")
    hint = tuple[float, dt.date, tuple[int, ...], Decimal]
    assert_same(round_trip(value, hint), value)
    assert_same(round_trip(1, float), 1)


def test_annotations_convert_plain_records() -> None:
    """A plain JSON record may be an old one, whose text meant a date: the hint decides."""
    assert_same(codec.decode('"2024-05-01"', dt.date), dt.date(2024, 5, 1))
    assert_same(codec.decode("[1, 2]", tuple[int, ...]), (1, 2))
    assert_same(codec.decode('"x"', dt.date), "x")  # does not fit: returned as stored
    assert_same(codec.decode('{"1": "a", "b": "c"}', dict[int, str]), {1: "a", "b": "c"})


def test_dataclass_that_no_longer_fits_is_an_encoding_error() -> None:
    """A stored mapping missing a required field of result_type is an EncodingError."""
    with pytest.raises(onceonly.EncodingError, match="Line"):
        codec.decode('{"sku":"a"}', Line)


def test_a_corrupt_stored_result_is_a_corrupt_record() -> None:
    """A replay whose stored result cannot be decoded raises CorruptRecord with the key."""
    record = Record("s", "k", State.COMPLETED, "2:" + "0" * 64, 1, 0, result='v2:{"$nope":1}')
    with pytest.raises(onceonly.CorruptRecord) as info:
        replayed_result(record, (), None)
    assert info.value.key == "k"
    assert info.value.scope == "s"


# -- result_type: pydantic, real and duck-typed


class DuckModel:
    """Just enough of the pydantic v2 model interface."""

    def __init__(self, n: int, at: dt.datetime) -> None:
        self.n = n
        self.at = at

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DuckModel) and (self.n, self.at) == (other.n, other.at)

    def model_dump(self, *, mode: str = "python") -> dict[str, Any]:
        return {"n": self.n, "at": self.at.isoformat() if mode == "json" else self.at}

    @classmethod
    def model_validate(cls, data: Any) -> DuckModel:
        return cls(data["n"], dt.datetime.fromisoformat(data["at"]))


def test_duck_typed_model_round_trip() -> None:
    """A model with model_dump/model_validate is stored as its JSON dump and rebuilt."""
    value = DuckModel(3, dt.datetime(2024, 5, 1, tzinfo=UTC))
    text = codec.encode(value)
    assert json.loads(text) == {"n": 3, "at": "2024-05-01T00:00:00+00:00"}
    assert round_trip(value, DuckModel) == value
    assert round_trip([value], list[DuckModel]) == [value]


def test_pydantic_model_round_trip() -> None:
    """Real pydantic models and TypeAdapters rebuild fields of the right type."""
    pydantic = pytest.importorskip("pydantic")

    class Charge(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        id: uuid.UUID
        at: dt.datetime
        amount: Decimal
        lines: tuple[int, ...]

    class StrictCharge(Charge):
        model_config = pydantic.ConfigDict(strict=True)

    for cls in (Charge, StrictCharge):
        value = cls(
            id=uuid.UUID(int=5),
            at=dt.datetime(2024, 5, 1, tzinfo=UTC),
            amount=Decimal("1.50"),
            lines=(1,),
        )
        back = round_trip(value, cls)
        assert back == value
        assert isinstance(back.amount, Decimal)
        assert isinstance(back.lines, tuple)
        adapter = pydantic.TypeAdapter(list[cls])
        assert round_trip([value], adapter) == [value]
    assert round_trip([dt.date(2024, 1, 1)], pydantic.TypeAdapter(list[dt.date])) == [
        dt.date(2024, 1, 1)
    ]


# -- the property


def hashables() -> st.SearchStrategy[Any]:
    scalars = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(st.characters(codec=None, exclude_categories=()))
        | st.binary(max_size=8)
        | st.decimals(allow_nan=False)
        | st.uuids()
        | st.dates()
        | st.datetimes(timezones=st.none() | st.just(UTC) | st.just(PLUS_0530))
        | st.times(timezones=st.none() | st.just(PLUS_0530))
        | st.timedeltas()
    )
    return st.recursive(scalars, _hashable_containers, max_leaves=4)


def _hashable_containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.tuples(children, children) | st.frozensets(children, max_size=3)


TAG_LIKE = st.sampled_from(["$tuple", "$set", "$dict", "$bytes", "$", "$$", "$$x", "$date"])


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=4) | TAG_LIKE, children, max_size=4)
        | st.dictionaries(hashables(), children, max_size=4)
        | st.sets(hashables(), max_size=4)
        | st.frozensets(hashables(), max_size=4)
    )


values = st.recursive(
    hashables() | st.builds(bytearray, st.binary(max_size=8)), _containers, max_leaves=20
)


@settings(max_examples=300, deadline=None)
@given(values)
def test_decode_encode_preserves_value_and_type(value: Any) -> None:
    """decode(encode(x)) == x, with the same type at every level."""
    assert_same(value, round_trip(value))


@pytest.mark.parametrize("typed", [True, False])
def test_depth_limit_is_the_same_on_every_python(typed: bool) -> None:
    """Both encodings accept MAX_DEPTH nested containers and refuse one more.

    The plain encoding used to rely on the recursion limit, which Python 3.12+ does not
    apply to json's C encoder (a 5,000-deep result was stored on 3.13).
    """
    from onceonly._core.canonical import MAX_DEPTH

    def nested(levels: int) -> Any:
        value: Any = "leaf"
        for i in range(levels):
            value = [value] if i % 2 else {"k": value}
        return value

    codec.encode(nested(MAX_DEPTH), typed=typed)
    with pytest.raises(onceonly.EncodingError, match="nested"):
        codec.encode(nested(MAX_DEPTH + 1), typed=typed)
