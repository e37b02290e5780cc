# SPDX-License-Identifier: MIT
"""The result codec: JSON text, type-preserving for results, never pickle.

**Results** (``what="result"``, the default) use the *typed* encoding, so a replay returns
a value equal to the first run's, of the same type (spec §2.7):

* plain JSON data (str-keyed dicts, lists, str, int, finite float, bool, None) is
  stored as compact JSON, exactly as before this encoding existed;
* anything else is stored as ``"v2:"`` + JSON in which a one-member object named ``$``
  and a letter is a tag: ``$datetime`` (ISO text, or ``[ISO, zone]`` for a
  :class:`zoneinfo.ZoneInfo`), ``$date``, ``$time``, ``$timedelta`` (``[days, seconds,
  microseconds]``), ``$decimal`` (its exact text), ``$uuid``, ``$bytes`` and
  ``$bytearray`` (base64), ``$tuple``, ``$set``, ``$frozenset`` (members in a stable
  order) and ``$dict`` (``[[key, value], ...]`` for a dict with a key that is not a
  str). A user's dict key that starts with ``$`` gets one more ``$``, so user data
  never reads as a tag. The ``v2:`` prefix makes the text invalid JSON, so a result
  stored by the old plain encoding (always valid JSON) is never mistaken for it and
  still decodes as before.
* dataclasses are stored as the mapping of their fields and pydantic models (anything
  with ``model_dump``) as ``model_dump(mode="json")``; they come back as that mapping
  unless ``decode`` is given a ``result_type``, which rebuilds them (dataclass fields
  from their annotations; models through ``model_validate_json``/``model_validate``,
  and pydantic ``TypeAdapter`` objects through ``validate_json``/``validate_python``).
  Int/str enums are stored as their value and rebuilt from an annotation too.
* Subclasses are stored as their base type (an ``OrderedDict`` comes back a dict);
  ``NaN``, infinities, ``memoryview``, plain enums and other objects are refused with
  :class:`EncodingError`, as are values nested deeper than ``MAX_DEPTH`` or circular.

**Payload snapshots, checkpoints and outbox payloads** (any other ``what``) use the
*plain* encoding: JSON that other programs read (brokers, consumers, an operator
redriving a message), with datetimes, dates and times as ISO text, Decimals and UUIDs as
text, sets as sorted lists and dataclasses/models as mappings.

Encoded text is bounded by ``max_bytes`` (:class:`TooLarge` past it) and is pure ASCII
(``\\u`` escapes), so any store can hold it.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import enum
import functools
import json
import math
import uuid
import zoneinfo
from collections import abc
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from onceonly._core.canonical import MAX_DEPTH
from onceonly._core.rebuild import Decoder, damaged, plain_hint
from onceonly.errors import ConfigurationError, EncodingError, TooLarge

__all__ = [
    "DEFAULT_MAX_BYTES",
    "TYPED_PREFIX",
    "checked_max_bytes",
    "decode",
    "encode",
]

DEFAULT_MAX_BYTES = 1024 * 1024
"""The default bound on an encoded result, in UTF-8 bytes."""

TYPED_PREFIX = "v2:"


def checked_max_bytes(value: object, what: str = "max_result_bytes") -> int:
    """``value`` as a bound on encoded results, refused at construction when it is not a
    positive whole number (a bound no result fits would fail every run with
    :class:`TooLarge`, and every message would end dead).

    Raises:
        ConfigurationError: ``value`` is not a positive ``int``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{what} must be a positive number of bytes, not {value!r}")
    return value


"""Marks a result stored by the typed encoding (never the start of JSON text)."""


def _is_model_instance(value: Any) -> bool:
    cls = type(value)
    return callable(getattr(cls, "model_dump", None)) and hasattr(cls, "model_validate")


def _cannot(what: str, why: str) -> EncodingError:
    return EncodingError(
        f"the {what} cannot be stored as JSON ({why}); "
        "return JSON data, a dataclass or a pydantic model"
    )


# -- the typed encoding


class _Tagger:
    """One walk over a value: JSON-ready data with tags (see the module docstring)."""

    def __init__(self, what: str, *, escape: bool) -> None:
        self.what = what
        self.escape = escape
        self.tagged = False  # a tag was needed: the text must say so
        self.escaped = False  # a "$" key was met
        self.active: set[int] = set()

    def tag(self, name: str, inner: Any) -> dict[str, Any]:
        self.tagged = True
        return {name: inner}

    def value(self, value: Any, depth: int) -> Any:
        if value is None or isinstance(value, (bool, str, int)):
            return value
        if isinstance(value, enum.Enum):  # rebuilt from an annotation (result_type)
            return self.value(value.value, depth)
        if isinstance(value, float):
            if not math.isfinite(value):
                raise _cannot(self.what, f"the non-finite number {value!r}")
            return value
        scalar = self.scalar(value)
        if scalar is not None:
            return scalar
        if depth >= MAX_DEPTH:
            raise _cannot(self.what, f"it is nested deeper than {MAX_DEPTH} levels")
        marker = id(value)
        if marker in self.active:
            raise _cannot(self.what, "it is circular (it contains itself)")
        self.active.add(marker)
        try:
            return self.container(value, depth + 1)
        finally:
            self.active.discard(marker)

    def scalar(self, value: Any) -> dict[str, Any] | None:
        if isinstance(value, dt.datetime):
            if value.tzinfo is not None and value.utcoffset() is None:
                raise _cannot(self.what, "a datetime whose zone gives no UTC offset")
            zone = value.tzinfo
            if isinstance(zone, zoneinfo.ZoneInfo) and zone.key:
                return self.tag("$datetime", [value.isoformat(), zone.key])
            return self.tag("$datetime", value.isoformat())
        if isinstance(value, dt.date):
            return self.tag("$date", value.isoformat())
        if isinstance(value, dt.time):
            if value.tzinfo is not None and value.utcoffset() is None:
                raise _cannot(self.what, "a time whose zone gives no fixed UTC offset")
            return self.tag("$time", value.isoformat())
        if isinstance(value, dt.timedelta):
            return self.tag("$timedelta", [value.days, value.seconds, value.microseconds])
        if isinstance(value, Decimal):
            return self.tag("$decimal", str(value))
        if isinstance(value, uuid.UUID):
            return self.tag("$uuid", str(value))
        if isinstance(value, bytes):
            return self.tag("$bytes", base64.b64encode(value).decode("ascii"))
        if isinstance(value, bytearray):
            return self.tag("$bytearray", base64.b64encode(value).decode("ascii"))
        return None

    def container(self, value: Any, depth: int) -> Any:
        if isinstance(value, list):
            return [self.value(v, depth) for v in value]
        if isinstance(value, abc.Mapping):
            return self.mapping(value, depth)
        if isinstance(value, tuple):
            return self.tag("$tuple", [self.value(v, depth) for v in value])
        if isinstance(value, (set, frozenset)):
            members = [self.value(v, depth) for v in value]
            members.sort(key=lambda m: json.dumps(m, sort_keys=True))
            return self.tag("$frozenset" if isinstance(value, frozenset) else "$set", members)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            return self.mapping(fields, depth)
        if _is_model_instance(value):
            try:
                dumped = value.model_dump(mode="json")
            except Exception as exc:
                raise _cannot(self.what, f"model_dump() failed: {exc!r}") from exc
            return self.value(dumped, depth - 1)
        raise _cannot(self.what, f"a {type(value).__name__} has no encoding")

    def mapping(self, value: abc.Mapping[Any, Any], depth: int) -> Any:
        if all(isinstance(k, str) for k in value):
            out: dict[str, Any] = {}
            for k, v in value.items():
                if k.startswith("$"):
                    self.escaped = True
                    if self.escape:
                        k = "$" + k
                out[k] = self.value(v, depth)
            return out
        return self.tag(
            "$dict", [[self.value(k, depth), self.value(v, depth)] for k, v in value.items()]
        )


# One encoder for every call (json.dumps with options builds a new one each time).
_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False, check_circular=False).encode


_SIMPLE = (str, int, bool, type(None))


def _flat(value: Any) -> bool:
    """Whether both encodings write ``value`` as plain ``json.dumps`` does: a scalar,
    or a ``dict`` of ``str`` keys (none starting with ``$``) to scalars. Exact types
    only (subclasses and enums take the general walk); floats must be finite."""
    kind = type(value)
    if kind in _SIMPLE:
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is not dict:
        return False
    for k, v in value.items():
        if type(k) is not str or k[:1] == "$":
            return False
        vkind = type(v)
        if vkind not in _SIMPLE and (vkind is not float or not math.isfinite(v)):
            return False
    return True


def _typed(value: Any, what: str) -> str:
    tagger = _Tagger(what, escape=True)
    data = tagger.value(value, 0)
    if tagger.tagged:
        return TYPED_PREFIX + _dumps(data)
    if tagger.escaped:  # plain JSON after all: store it without the escapes
        data = _Tagger(what, escape=False).value(value, 0)
    return _dumps(data)


# -- the plain encoding


def _plain_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (set, frozenset)):
        try:
            return sorted(value)
        except Exception as exc:  # TypeError, or InvalidOperation for Decimal('NaN')
            raise TypeError(f"the members of a set do not sort ({exc!r})") from exc
    if _is_model_instance(value):
        try:
            return value.model_dump(mode="json")
        except Exception as exc:
            raise TypeError(f"model_dump() failed: {exc!r}") from exc
    raise TypeError(f"a {type(value).__name__} has no JSON form")


def _plain(value: Any) -> str:
    text = json.dumps(value, default=_plain_default, separators=(",", ":"), allow_nan=False)
    # json.dumps has no depth limit of its own: it stops at the interpreter's recursion
    # limit, which Python 3.12+ no longer applies to C code. Fewer brackets than
    # MAX_DEPTH (the common case, counted at C speed) cannot nest that deep.
    if text.count("[") + text.count("{") > MAX_DEPTH:
        _check_depth(json.loads(text))
    return text


def _check_depth(node: Any) -> None:
    """Raise RecursionError when ``node`` nests containers deeper than ``MAX_DEPTH``."""
    stack: list[tuple[Any, int]] = [(node, 0)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if isinstance(item, (dict, list)):
            if depth >= MAX_DEPTH:
                raise RecursionError
            stack.extend((child, depth + 1) for child in children)


def encode(
    value: Any,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    what: str = "result",
    typed: bool | None = None,
) -> str:
    """Encode ``value`` as compact JSON text (see the module docstring).

    Args:
        value: the value to store.
        max_bytes: the bound on the encoded text, in UTF-8 bytes.
        what: what is encoded (named in errors): ``"result"``, ``"payload"``, ...
        typed: use the typed encoding (read back with :func:`decode`); by default
            results are typed and anything else is plain JSON.

    Raises:
        EncodingError: the value has a part the encoding cannot hold, is nested deeper
            than ``MAX_DEPTH``, or is circular.
        TooLarge: the encoding is longer than ``max_bytes`` bytes (UTF-8).
    """
    if value is None and max_bytes >= 4:  # the commonest result: a handler returning None
        return "null"
    if typed is None:
        typed = what == "result"
    try:
        if _flat(value):  # the common case needs no walk (byte-identical, tested)
            text = _dumps(value)
        elif typed:
            text = _typed(value, what)
        else:
            text = _plain(value)
    except EncodingError:
        raise
    except RecursionError:
        raise _cannot(what, "it is nested too deeply") from None
    except (TypeError, ValueError) as exc:
        raise _cannot(what, str(exc)) from exc
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise TooLarge(f"the encoded {what} is {size} bytes; the limit is {max_bytes}")
    return text


# -- decoding

# What json.loads runs on a text without surrounding whitespace (its default decoder's
# scanner: the C one where there is one), without the set-up of each call.
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=256)
def _plain_hinted(result_type: Any) -> bool:
    return plain_hint(result_type)


def _plain_hint(result_type: Any, text: str) -> bool:
    """Whether the Decoder would return ``text`` (plain JSON) as parsed under
    ``result_type`` (:func:`~onceonly._core.rebuild.plain_hint`), nested too little for
    its depth check (fewer brackets than ``MAX_DEPTH``, counted at C speed)."""
    try:
        plain = _plain_hinted(result_type)
    except TypeError:  # an unhashable hint
        plain = plain_hint(result_type)
    return plain and text.count("[") + text.count("{") <= MAX_DEPTH


def decode(text: str, result_type: Any = None) -> Any:
    """Decode a stored result; rebuild ``result_type`` when given.

    Args:
        text: what :func:`encode` returned, or a result stored by the older plain
            encoding (decoded as the JSON it is).
        result_type: a dataclass, a pydantic model or ``TypeAdapter``, a container or
            Optional of those, or any annotation (values that do not fit it are returned
            as stored).

    Raises:
        EncodingError: the text is damaged, or a stored mapping no longer fits the
            dataclass or model it should be rebuilt as.
    """
    legacy = not text.startswith(TYPED_PREFIX)
    if legacy and (result_type is None or _plain_hint(result_type, text)):
        # the commonest replay: plain JSON as encode() wrote it (no surrounding
        # whitespace), read by json.loads's own C scanner without its set-up; anything
        # else (whitespace, trailing text, an error) takes json.loads below
        try:
            node, end = _scan(text, 0)
        except (StopIteration, ValueError, RecursionError):
            end = -1
        if end == len(text):
            return node
    try:
        node = json.loads(text if legacy else text[len(TYPED_PREFIX) :])
    except RecursionError:
        raise damaged("it is nested too deeply") from None
    except ValueError as exc:
        raise damaged(f"it is not JSON ({exc})") from exc
    if legacy and result_type is None:
        return node
    try:
        return Decoder(legacy=legacy).decode(node, result_type, 0)
    except RecursionError:
        raise damaged("it is nested too deeply") from None
