# SPDX-License-Identifier: MIT
"""Canonical JSON for fingerprints and content keys (spec §2.2, fingerprint scheme 2).

Two payloads that mean the same get the same bytes, and two payloads that do not get
different bytes (the form is injective on everything it accepts; what it cannot encode
that way it refuses with :class:`~onceonly.InvalidPayload`).

Intended equivalences (documented, tested):

* mapping key order and the whitespace of JSON text do not count; JSON text (``str``
  or UTF-8 ``bytes``) is parsed first, its numbers read as IEEE 754 doubles;
* numbers are compared by value: ``1 == 1.0 == Decimal("1.00")``, ``0.5 ==
  Decimal("0.5")`` (a Decimal equals a float when it is exactly the float's shortest
  decimal spelling; other Decimals keep every digit);
* a tuple is a list, a dataclass the mapping of its fields, a date/time the ISO text
  JSON would carry, a UUID its canonical text.

Encoding rules that keep it injective:

* a tag is a one-member object whose name is ``$`` and a letter: ``{"$text": s}`` (a
  top-level str that is not JSON), ``{"$bytes": b64}`` (bytes that are not UTF-8
  JSON, and bytes inside a payload), ``{"$map": [[k, v], ...]}`` (a mapping with a
  key that is not text; entries sorted by the key's canonical bytes) and
  ``{"$decimal": "<digits>e<exp>"}`` (a Decimal that no float spells);
* a user's mapping key that starts with ``$`` gets one more ``$`` (``"$x"`` is written
  ``"$$x"``), so user data can never spell a tag;
* two keys of one mapping with the same canonical form (``date(2024, 5, 1)`` and
  ``"2024-05-01"``) are refused rather than one of them dropped.

Limits, so that every call ends quickly whatever the payload:

* ``MAX_DEPTH``: containers nested deeper than this are refused (JSON text included);
  so are circular structures;
* ``MAX_INT_DIGITS``: integers (and integral Decimals) with more decimal digits are
  refused (Python's own int/str conversion limit; it is quadratic beyond), as are
  Decimals whose coefficient has more digits; a Decimal's exponent is never expanded
  past it (``Decimal("1e999999999")`` is refused at once, not computed);
* non-finite numbers (``NaN``, ``Infinity``, ``1e999`` in JSON text or as a float,
  Decimal ``NaN``/``sNaN``/``Infinity``) and text with lone surrogates (not UTF-8
  encodable) are refused; so are duplicate member names in JSON text (readers
  disagree on which one wins).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import itertools
import json
import math
import uuid
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any

from onceonly.errors import InvalidPayload

__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "canonical_json"]

MAX_DEPTH = 100
"""Deepest nesting of containers (lists, tuples, mappings, dataclasses) a payload may have."""

MAX_INT_DIGITS = 4300
"""Most decimal digits a number may have (Python's default int/str conversion limit)."""

# an int with more bits than this certainly has more than MAX_INT_DIGITS digits
_MAX_INT_BITS = math.ceil(MAX_INT_DIGITS * math.log2(10)) + 1

_HOW = "pass fingerprint= (a callable) or fields= to choose what identifies the payload"


def _refuse(why: str) -> InvalidPayload:
    return InvalidPayload(f"cannot fingerprint the payload: {why}; {_HOW}")


class _Canonicaliser:
    """One walk over a payload: normalises it into JSON-ready data."""

    def __init__(self) -> None:
        self.active: set[int] = set()  # ids of the containers on the current path

    def value(self, value: Any, depth: int) -> Any:
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return _integer(int(value))
        if isinstance(value, float):
            return _float(value)
        if isinstance(value, Decimal):
            return _decimal(value)
        if isinstance(value, (dt.datetime, dt.date, dt.time)):
            return value.isoformat()
        if isinstance(value, uuid.UUID):
            return str(value)
        if isinstance(value, (bytes, bytearray, memoryview)):
            return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
        is_dataclass = dataclasses.is_dataclass(value) and not isinstance(value, type)
        if not (is_dataclass or isinstance(value, (Mapping, list, tuple))):
            raise _refuse(f"a {type(value).__name__} has no canonical form")
        if depth >= MAX_DEPTH:
            raise _refuse(f"it is nested deeper than {MAX_DEPTH} levels (MAX_DEPTH)")
        marker = id(value)
        if marker in self.active:
            raise _refuse("it is circular (it contains itself)")
        self.active.add(marker)
        try:
            if isinstance(value, (list, tuple)):
                return [self.value(v, depth + 1) for v in value]
            if is_dataclass:
                value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            return self.mapping(value, depth + 1)
        finally:
            self.active.discard(marker)

    def mapping(self, value: Mapping[Any, Any], depth: int) -> Any:
        entries = [(self.value(k, depth), self.value(v, depth)) for k, v in value.items()]
        if all(isinstance(k, str) for k, _ in entries):
            out = {("$" + k if k.startswith("$") else k): v for k, v in entries}
            if len(out) < len(entries):
                raise _refuse("two keys of a mapping have the same canonical form")
            return out
        keyed = sorted(((_dumps(k), k, v) for k, v in entries), key=lambda e: e[0])
        for (a, _, _), (b, _, _) in itertools.pairwise(keyed):
            if a == b:
                raise _refuse("two keys of a mapping have the same canonical form")
        return {"$map": [[k, v] for _, k, v in keyed]}


def _integer(value: int) -> int:
    if value.bit_length() > _MAX_INT_BITS or len(_digits(value)) > MAX_INT_DIGITS:
        raise _refuse(f"an integer has more than {MAX_INT_DIGITS} digits (MAX_INT_DIGITS)")
    return value


def _digits(value: int) -> str:
    try:
        return str(abs(value))
    except ValueError:  # past sys.get_int_max_str_digits(), when set lower than ours
        raise _refuse("an integer has too many digits for this interpreter") from None


def _float(value: float) -> int | float:
    if not math.isfinite(value):
        raise _refuse(f"the non-finite number {value!r}")
    return int(value) if value.is_integer() else float(value)


def _decimal(value: Decimal) -> Any:
    """A Decimal by its exact value, without ever expanding a huge exponent."""
    if not value.is_finite():
        raise _refuse(f"the non-finite number {value!r}")
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)  # finite
    if len(digits) > MAX_INT_DIGITS:
        raise _refuse(f"a Decimal has more than {MAX_INT_DIGITS} digits (MAX_INT_DIGITS)")
    coefficient = "".join(map(str, digits)).rstrip("0")
    if not coefficient:
        return 0
    exponent += len(digits) - len(coefficient)
    if exponent >= 0:  # an integer: as many digits as the coefficient plus the exponent
        if len(coefficient) + exponent > MAX_INT_DIGITS:
            raise _refuse(f"a number has more than {MAX_INT_DIGITS} digits (MAX_INT_DIGITS)")
        number = int(coefficient) * 10**exponent
        return -number if sign else number
    as_float = float(value)
    if math.isfinite(as_float) and Decimal(repr(as_float)) == value:
        return as_float  # the same number as the float that JSON would carry
    return {"$decimal": f"{'-' if sign else ''}{coefficient}e{exponent}"}


# One encoder for every call (json.dumps with options builds a new one each time).
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_dumps = _ENCODER.encode


def _c_encoder() -> Callable[[Any], str]:
    """:data:`_dumps` without its per-call set-up: the C encoder ``_ENCODER.encode``
    builds on every call, built once (no circular check: :func:`_plain` bounds the
    depth of what it is given). Where the C encoder is missing, :data:`_dumps`."""
    make = getattr(json.encoder, "c_make_encoder", None)
    quote = getattr(json.encoder, "c_encode_basestring", None)
    if make is None or quote is None:
        return _dumps
    encoder = make(None, _ENCODER.default, quote, None, ":", ",", True, False, True)

    def dumps(value: Any) -> str:
        return "".join(encoder(value, 0))

    return dumps


# only for containers that passed _plain (the C encoder's output is the same)
_dumps_plain = _c_encoder()


class _JsonText:
    """Parses JSON text strictly enough that its meaning is unambiguous."""

    @staticmethod
    def constant(name: str) -> Any:
        raise _refuse(f"JSON text holds the non-finite number {name}")

    @staticmethod
    def number(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise _refuse(f"JSON text holds a number out of range ({text[:20]})")
        return value

    @staticmethod
    def integer(text: str) -> int:
        if len(text.lstrip("-")) > MAX_INT_DIGITS:
            raise _refuse(f"JSON text holds an integer of more than {MAX_INT_DIGITS} digits")
        return int(text)

    @staticmethod
    def members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) < len(pairs):
            raise _refuse("JSON text holds an object with a duplicate member name")
        return out

    @classmethod
    def parse(cls, text: str) -> tuple[bool, Any]:
        """``(True, value)`` for JSON text, ``(False, None)`` for other text."""
        try:
            return True, json.loads(
                text,
                parse_constant=cls.constant,
                parse_float=cls.number,
                parse_int=cls.integer,
                object_pairs_hook=cls.members,
            )
        except RecursionError:
            raise _refuse(f"its JSON text is nested deeper than {MAX_DEPTH} levels") from None
        except ValueError:
            return False, None


@dataclasses.dataclass(frozen=True)
class _Text:
    """A top-level str that is not JSON text: tagged, so it never equals a JSON value."""

    text: str


def _parse_text(payload: Any) -> Any:
    """JSON text (str or UTF-8 bytes) is compared by meaning; other text by its content."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        raw = bytes(payload)
        try:
            ok, value = _JsonText.parse(raw.decode("utf-8"))
        except UnicodeDecodeError:
            ok, value = False, None
        return value if ok else raw
    if isinstance(payload, str):
        ok, value = _JsonText.parse(payload)
        return value if ok else _Text(payload)
    return payload


# The first characters JSON text may start with (json.loads skips leading whitespace
# and accepts NaN/Infinity, which the slow path then refuses). Text that starts with
# anything else (or is empty) is not JSON, so it is tagged as text without parsing.
_JSON_START = frozenset(' \t\n\r{["-0123456789tfnNI')
# Scalars a container may hold on the fast path as they are. bool is its own type (not
# ``int``); int/str subclasses (enums) and every other type are left to the slow path.
_PLAIN = frozenset({str, bool, type(None)})
_FAST_INT = 2**63  # far below MAX_INT_DIGITS: an int in (-2**63, 2**63) needs no digit check


def _plain(value: Any, depth: int) -> bool:
    """Whether the general walk leaves ``value`` (a container) as it is, so that
    ``json`` writes it as the walk's output would be written.

    True for a ``dict`` (exact type) whose keys are ``str`` and a ``list`` or ``tuple``
    (exact types; both are JSON arrays either way), nested less than ``MAX_DEPTH`` deep,
    whose members are ``str``, ``bool``, ``None``, exact ``int`` within 63 bits, finite
    non-integral ``float`` (the walk writes an integral float, ``-0.0`` and ``1e16``
    included, as an int) or such containers. Keys starting with ``$`` (which the walk
    escapes) are not looked at here: :func:`_fast` finds them in the output.
    """
    kind = type(value)
    if depth >= MAX_DEPTH:
        return False
    if kind is dict:
        for k in value:
            if type(k) is not str:
                return False
        members = value.values()
    elif kind is list or kind is tuple:
        members = value
    else:
        return False
    depth += 1
    for v in members:
        vkind = type(v)
        if vkind in _PLAIN:
            continue
        if vkind is int:
            if -_FAST_INT < v < _FAST_INT:
                continue
            return False
        if vkind is float:
            if math.isfinite(v) and not v.is_integer():
                continue
            return False
        if not _plain(v, depth):
            return False
    return True


def _fast(payload: Any) -> bytes | None:
    """The canonical bytes of the commonest payloads, or ``None`` for the general walk.

    Covers text that is not JSON, exact ``int``, ``bool``, ``None``, and the JSON-like
    containers :func:`_plain` accepts, written by the C encoder. A ``"$`` anywhere in
    that output may be a key starting with ``$`` (which the walk escapes): such a payload
    goes to the general walk too. The output is byte-identical to :func:`_slow`'s (a
    Hypothesis test compares them).
    """
    kind = type(payload)
    if kind is str:
        if payload and payload[0] in _JSON_START:
            return None  # may be JSON text: parse it on the slow path
        return ('{"$text":' + _ENCODER.encode(payload) + "}").encode("utf-8")
    if kind is int:
        return str(payload).encode() if -_FAST_INT < payload < _FAST_INT else None
    if kind is dict or kind is list or kind is tuple:
        if not _plain(payload, 0):
            return None
        text = _dumps_plain(payload)
        return None if '"$' in text else text.encode("utf-8")
    if payload is None or kind is bool:
        return _dumps(payload).encode()
    return None


def canonical_json(payload: Any, fields: Iterable[str] | None = None) -> bytes:
    """The canonical UTF-8 JSON bytes of ``payload`` (see the module docstring).

    Args:
        payload: JSON-like data, a dataclass, or JSON text (str/bytes).
        fields: if given, only these top-level fields of a mapping count; a missing
            field counts as ``null``.

    Raises:
        InvalidPayload: the payload holds something without a canonical form, or is
            past a limit (``MAX_DEPTH``, ``MAX_INT_DIGITS``). Every call ends quickly.
    """
    if fields is None:
        try:
            fast = _fast(payload)
        except UnicodeEncodeError:
            raise _refuse("it holds text with a lone surrogate (not valid Unicode)") from None
        except RecursionError:  # the caller's stack is nearly full: the slow path says so
            fast = None
        if fast is not None:
            return fast
    return _slow(payload, fields)


def _slow(payload: Any, fields: Iterable[str] | None = None) -> bytes:
    """:func:`canonical_json` by the general walk (every payload it accepts)."""
    value = _parse_text(payload)
    if fields is not None:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        if not isinstance(value, Mapping):
            raise InvalidPayload(f"fields= needs a mapping payload, not {type(value).__name__}")
        value = {name: value.get(name) for name in fields}
    try:
        if isinstance(value, _Text):
            normal: Any = {"$text": value.text}
        else:
            normal = _Canonicaliser().value(value, 0)
        return _dumps(normal).encode("utf-8")
    except UnicodeEncodeError:
        raise _refuse("it holds text with a lone surrogate (not valid Unicode)") from None
    except RecursionError:  # only when the caller's stack is already nearly full
        raise _refuse("it is nested too deeply for the remaining stack") from None
