# SPDX-License-Identifier: MIT
"""Rebuilding decoded results as the types they were (docs/spec.md §2.7).

:class:`Decoder` walks the JSON of a stored result and rebuilds what its tags say
(``$datetime``, ``$decimal``, ``$tuple``, …) and, with a ``result_type``, what the
annotation says: dataclass fields from their annotations, pydantic models and
``TypeAdapter`` objects (duck-typed, never imported), containers and ``Optional``. A
record stored before the tags existed (``legacy``) is plain JSON, so there the
annotation also turns ISO text back into datetimes and lists into tuples and sets.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import enum
import json
import typing
import uuid
import zoneinfo
from collections import abc
from decimal import Decimal, InvalidOperation
from typing import Any

from onceonly._core.canonical import MAX_DEPTH
from onceonly.errors import EncodingError

__all__ = ["Decoder", "damaged", "plain_hint"]


class _NoFit(Exception):
    """The stored value does not fit the type tried (inside a Union: try the next)."""


def damaged(why: str) -> EncodingError:
    return EncodingError(f"the stored result cannot be decoded: {why}")


_NONE_TYPE = type(None)
_LISTS = (list, abc.Sequence, abc.MutableSequence, abc.Iterable, abc.Collection)
_SETS = (set, frozenset, abc.Set, abc.MutableSet)
_MAPPINGS = (dict, abc.Mapping, abc.MutableMapping)


def _resolve(tp: Any) -> Any:
    """The type a hint asks for, ``None`` when it asks for nothing in particular."""
    while True:
        if tp is None or tp is Any or tp is object or isinstance(tp, typing.TypeVar):
            return None
        if isinstance(tp, str | typing.ForwardRef):
            return None  # an annotation that could not be resolved
        if typing.get_origin(tp) is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif hasattr(tp, "__supertype__"):  # NewType
            tp = tp.__supertype__
        else:
            return tp


def _is_union(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    return origin is typing.Union or type(tp).__name__ == "UnionType"


def _is_model_type(tp: Any) -> bool:
    if _is_class(tp):
        return callable(getattr(tp, "model_validate", None)) and hasattr(tp, "model_dump")
    return typing.get_origin(tp) is None and callable(getattr(tp, "validate_python", None))


def _dataclass_type(tp: Any) -> Any:
    cls = typing.get_origin(tp) or tp
    return cls if _is_class(cls) and dataclasses.is_dataclass(cls) else None


def _hints(cls: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # unresolvable annotations: use what is not a string
        annotations = getattr(cls, "__annotations__", {})
        return {k: v for k, v in annotations.items() if not isinstance(v, str)}


def _is_namedtuple(tp: Any) -> bool:
    return _is_class(tp) and issubclass(tp, tuple) and hasattr(tp, "_fields")


def _item_hints(tp: Any, count: int) -> list[Any]:
    """Per-position hints for the items of a tuple (or NamedTuple) hint."""
    if _is_namedtuple(tp):
        hints = _hints(tp)
        names = list(tp._fields)
        return [hints.get(names[i]) if i < len(names) else None for i in range(count)]
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return [args[0]] * count
        if args and args != ((),):
            return [args[i] if i < len(args) else None for i in range(count)]
    return [None] * count


def _element_hint(tp: Any, kinds: tuple[Any, ...]) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    return args[0] if origin in kinds and args else None


def _key_value_hints(tp: Any) -> tuple[Any, Any]:
    if typing.get_origin(tp) in _MAPPINGS and len(typing.get_args(tp)) == 2:
        key, value = typing.get_args(tp)
        return key, value
    return None, None


_ISO_TYPES: dict[Any, Any] = {
    dt.datetime: dt.datetime.fromisoformat,
    dt.date: dt.date.fromisoformat,
    dt.time: dt.time.fromisoformat,
}


def _legacy_scalar(node: Any, tp: Any) -> Any:
    """A value of the plain encoding converted to ``tp`` (raises _NoFit)."""
    try:
        if tp in _ISO_TYPES and isinstance(node, str):
            return _ISO_TYPES[tp](node)
        if tp is uuid.UUID and isinstance(node, str):
            return uuid.UUID(node)
        if tp is Decimal and isinstance(node, (str, int)) and not isinstance(node, bool):
            return Decimal(node)
        if tp is Decimal and isinstance(node, float):
            return Decimal(repr(node))
        if tp is int and isinstance(node, str):  # a dict key
            return int(node)
        if tp is float and isinstance(node, str):  # a dict key
            return float(node)
        if tp is bool and node in ("true", "false"):  # a dict key
            return node == "true"
    except (ValueError, TypeError, InvalidOperation):
        pass
    raise _NoFit


def plain_hint(tp: Any) -> bool:
    """Whether ``tp`` asks nothing of a plain (legacy) JSON result that parsing does not
    already give: no hint, ``Any``/``object``, bare ``dict``/``list``, or
    ``dict[str, …]``/``list[…]`` of such hints. :class:`Decoder` (``legacy=True``)
    returns such a result as parsed (a test compares them)."""
    tp = _resolve(tp)
    if tp is None or tp is dict or tp is list:
        return True
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is dict and len(args) == 2:
        return _resolve(args[0]) in (None, str) and plain_hint(args[1])
    if origin is list and len(args) == 1:
        return plain_hint(args[0])
    return False


class Decoder:
    """Turns parsed JSON back into values, guided by an optional type hint.

    ``legacy``: the text is the plain encoding (no tags); hints then also convert
    text back to datetimes, Decimals, UUIDs and lists back to tuples and sets. A typed
    text carries its own types; hints only rebuild dataclasses, models and enums.
    """

    def __init__(self, *, legacy: bool) -> None:
        self.legacy = legacy

    def decode(self, node: Any, tp: Any, depth: int, strict: bool = False) -> Any:
        if depth > MAX_DEPTH + 1:
            raise damaged(f"it is nested deeper than {MAX_DEPTH} levels")
        tp = _resolve(tp)
        if node is None:
            return None
        if tp is not None and _is_union(tp):
            return self.union(node, tp, depth, strict)
        if tp is not None and _is_model_type(tp):
            return self.model(node, tp, depth, strict)
        if isinstance(node, dict):
            if not self.legacy and len(node) == 1:
                ((name, inner),) = node.items()
                if name.startswith("$") and not name.startswith("$$"):
                    return self.tagged(name, inner, tp, depth, strict)
            return self.mapping(node, tp, depth, strict)
        if isinstance(node, list):
            return self.sequence(node, tp, depth, strict)
        return self.scalar(node, tp, strict)

    def union(self, node: Any, tp: Any, depth: int, strict: bool) -> Any:
        for arg in typing.get_args(tp):
            if arg is _NONE_TYPE:
                continue
            try:
                return self.decode(node, arg, depth, strict=True)
            except (_NoFit, EncodingError):
                continue
        if strict:
            raise _NoFit
        return self.decode(node, None, depth)

    def model(self, node: Any, tp: Any, depth: int, strict: bool) -> Any:
        plain = self.decode(node, None, depth)
        by_json = "model_validate_json" if _is_class(tp) else "validate_json"
        by_python = "model_validate" if _is_class(tp) else "validate_python"
        try:
            try:
                text = json.dumps(plain, allow_nan=False)
            except (TypeError, ValueError):  # typed values inside: validate them as they are
                text = None
            if text is not None and callable(getattr(tp, by_json, None)):
                return getattr(tp, by_json)(text)
            return getattr(tp, by_python)(plain)
        except Exception as exc:
            if strict:
                raise _NoFit from exc
            raise damaged(f"it does not fit {_name(tp)}: {exc}") from exc

    def mapping(self, node: dict[str, Any], tp: Any, depth: int, strict: bool) -> Any:
        items: dict[str, Any] = {}
        for name, inner in node.items():
            if not self.legacy and name.startswith("$"):
                if not name.startswith("$$"):
                    raise damaged(f"the member {name!r} is neither a tag nor escaped")
                name = name[1:]
            items[name] = inner
        cls = _dataclass_type(tp)
        if cls is not None:
            return self.dataclass(items, cls, depth, strict)
        key_hint, value_hint = _key_value_hints(tp)
        if strict and tp is not None and key_hint is None and tp not in _MAPPINGS:
            raise _NoFit
        out: dict[Any, Any] = {}
        for name, inner in items.items():
            key: Any = name
            if self.legacy and _resolve(key_hint) not in (None, str):
                key = self.legacy_key(name, key_hint)
            out[key] = self.decode(inner, value_hint, depth + 1)
        return out

    def legacy_key(self, name: str, hint: Any) -> Any:
        try:
            return self.scalar(name, hint, strict=True)
        except _NoFit:
            return name

    def dataclass(self, items: dict[str, Any], cls: Any, depth: int, strict: bool) -> Any:
        hints = _hints(cls)
        kwargs = {
            f.name: self.decode(items[f.name], hints.get(f.name), depth + 1)
            for f in dataclasses.fields(cls)
            if f.init and f.name in items
        }
        try:
            return cls(**kwargs)
        except Exception as exc:
            if strict:
                raise _NoFit from exc
            raise damaged(f"it does not fit {_name(cls)}: {exc}") from exc

    def sequence(self, node: list[Any], tp: Any, depth: int, strict: bool) -> Any:
        origin = typing.get_origin(tp) or tp
        if self.legacy and (origin is tuple or _is_namedtuple(tp)):
            return self.tuple(node, tp, depth)
        if self.legacy and origin in _SETS:
            return self.set(node, tp, depth, frozen=origin is frozenset)
        if strict and tp is not None and origin not in _LISTS:
            raise _NoFit
        hint = _element_hint(tp, _LISTS)
        return [self.decode(v, hint, depth + 1) for v in node]

    def tuple(self, node: list[Any], tp: Any, depth: int) -> Any:
        hints = _item_hints(tp, len(node))
        items = tuple(self.decode(v, h, depth + 1) for v, h in zip(node, hints, strict=True))
        if _is_namedtuple(tp):
            try:
                return tp(*items)
            except TypeError:
                return items
        return items

    def set(self, node: list[Any], tp: Any, depth: int, *, frozen: bool) -> Any:
        hint = _element_hint(tp, _SETS)
        members = [self.decode(v, hint, depth + 1) for v in node]
        try:
            return frozenset(members) if frozen else set(members)
        except TypeError as exc:  # unhashable: mappings that no hint rebuilt
            raise damaged(f"a set holds unhashable members ({exc})") from exc

    def tagged(self, name: str, inner: Any, tp: Any, depth: int, strict: bool) -> Any:
        if name == "$tuple":
            return self.tuple(_items(name, inner), tp, depth)
        if name in ("$set", "$frozenset"):
            return self.set(_items(name, inner), tp, depth, frozen=name == "$frozenset")
        if name == "$dict":
            return self.dict_tag(_items(name, inner), tp, depth)
        try:
            value = _scalar_tag(name, inner)
        except (ValueError, TypeError, OverflowError, binascii.Error, InvalidOperation) as exc:
            raise damaged(f"the {name} tag holds {_preview(inner)}") from exc
        if strict and _is_class(tp) and not isinstance(value, tp):
            raise _NoFit
        return value

    def dict_tag(self, pairs: list[Any], tp: Any, depth: int) -> dict[Any, Any]:
        key_hint, value_hint = _key_value_hints(tp)
        out: dict[Any, Any] = {}
        for pair in pairs:
            if not isinstance(pair, list) or len(pair) != 2:
                raise damaged("a $dict entry is not a [key, value] pair")
            key = self.decode(pair[0], key_hint, depth + 1)
            try:
                out[key] = self.decode(pair[1], value_hint, depth + 1)
            except TypeError as exc:
                if isinstance(exc, EncodingError):
                    raise
                raise damaged(f"a $dict key is unhashable ({exc})") from exc
        return out

    def scalar(self, node: Any, tp: Any, strict: bool) -> Any:
        if tp is None:
            return node
        if _is_class(tp) and issubclass(tp, enum.Enum):
            try:
                return tp(node)
            except ValueError:
                if strict:
                    raise _NoFit from None
                return node
        if _is_class(tp) and isinstance(node, tp) and not (tp is int and isinstance(node, bool)):
            return node
        if self.legacy:
            try:
                return _legacy_scalar(node, tp)
            except _NoFit:
                if strict:
                    raise
                return node
        if strict and _is_class(tp):
            raise _NoFit
        return node


def _items(name: str, inner: Any) -> list[Any]:
    if not isinstance(inner, list):
        raise damaged(f"the {name} tag holds {_preview(inner)}, not a list")
    return inner


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:79] + "…"


def _is_class(tp: Any) -> bool:
    """A plain class (not a parameterised generic such as ``list[int]``)."""
    return isinstance(tp, type) and typing.get_origin(tp) is None


_FROM_TEXT: dict[str, Any] = {
    "$date": dt.date.fromisoformat,
    "$time": dt.time.fromisoformat,
    "$decimal": Decimal,
    "$uuid": uuid.UUID,
    "$bytes": lambda text: base64.b64decode(text, validate=True),
    "$bytearray": lambda text: bytearray(base64.b64decode(text, validate=True)),
}


def _scalar_tag(name: str, inner: Any) -> Any:
    """The value of a scalar tag; ValueError or TypeError when it is damaged."""
    if name == "$datetime":
        if isinstance(inner, list) and len(inner) == 2 and isinstance(inner[1], str):
            value = _text_only(dt.datetime.fromisoformat, inner[0])
            try:
                return value.astimezone(zoneinfo.ZoneInfo(inner[1]))
            except (KeyError, ValueError, TypeError, OSError, OverflowError):
                return value  # the zone is unknown here: keep the fixed offset
        return _text_only(dt.datetime.fromisoformat, inner)
    if name == "$timedelta":
        if not (isinstance(inner, list) and len(inner) == 3):
            raise TypeError("not [days, seconds, microseconds]")
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in inner):
            raise TypeError("not [days, seconds, microseconds]")
        days, seconds, microseconds = inner
        return dt.timedelta(days=days, seconds=seconds, microseconds=microseconds)
    if name in _FROM_TEXT:
        return _text_only(_FROM_TEXT[name], inner)
    raise ValueError(f"unknown tag {name}")


def _text_only(parse: Any, inner: Any) -> Any:
    if not isinstance(inner, str):
        raise TypeError("not text")
    return parse(inner)


def _name(tp: Any) -> str:
    return getattr(tp, "__qualname__", None) or repr(tp)
