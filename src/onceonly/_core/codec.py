# SPDX-License-Identifier: MIT
"""The result codec: JSON text, dataclasses supported, never pickle.

Encoded results are bounded by ``max_bytes`` (:class:`TooLarge` past it). On decode, a
dataclass type (from the handler's return annotation or ``result_type=``) is rebuilt
from the stored mapping, recursively through its annotated fields.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import typing
import uuid
from decimal import Decimal
from typing import Any

from onceonly.errors import EncodingError, TooLarge

DEFAULT_MAX_BYTES = 1024 * 1024


def _default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(type(value).__name__)


def encode(value: Any, *, max_bytes: int = DEFAULT_MAX_BYTES, what: str = "result") -> str:
    """Encode ``value`` as compact JSON text.

    Raises:
        EncodingError: the value has a part JSON cannot hold.
        TooLarge: the encoding is longer than ``max_bytes`` bytes (UTF-8).
    """
    try:
        text = json.dumps(value, default=_default, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise EncodingError(
            f"the {what} cannot be stored as JSON ({exc}); return JSON data or a dataclass"
        ) from exc
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise TooLarge(f"the encoded {what} is {size} bytes; the limit is {max_bytes}")
    return text


def decode(text: str, result_type: Any = None) -> Any:
    """Decode JSON ``text``; rebuild ``result_type`` when it is a dataclass."""
    return _rebuild(json.loads(text), result_type)


def _rebuild(value: Any, tp: Any) -> Any:
    if tp is None or value is None:
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type) and isinstance(value, dict):
        try:
            hints = typing.get_type_hints(tp)
        except Exception:  # unresolvable annotations: build from plain values
            hints = {}
        kwargs = {
            f.name: _rebuild(value[f.name], hints.get(f.name))
            for f in dataclasses.fields(tp)
            if f.init and f.name in value
        }
        return tp(**kwargs)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or type(tp).__name__ == "UnionType":  # Optional[A], A | None
        for arg in args:
            if dataclasses.is_dataclass(arg) and isinstance(value, dict):
                return _rebuild(value, arg)
        return value
    if origin is dict and isinstance(value, dict) and len(args) == 2:
        return {k: _rebuild(v, args[1]) for k, v in value.items()}
    if origin in (list, tuple) and isinstance(value, list) and args:
        inner = args[0]
        items = [_rebuild(v, inner) for v in value]
        return tuple(items) if origin is tuple else items
    return value


def encode_error(exc: BaseException) -> str:
    """Encode an exception for replay to duplicates: its class path and its arguments."""
    cls = type(exc)
    args: list[Any] = []
    for arg in exc.args:
        try:
            json.dumps(arg)
        except (TypeError, ValueError):
            arg = str(arg)
        args.append(arg)
    return json.dumps(
        {"type": f"{cls.__module__}.{cls.__qualname__}", "args": args}, separators=(",", ":")
    )


def error_summary(exc: BaseException, limit: int = 2000) -> str:
    """A one-line summary of ``exc`` for the record's ``error`` column."""
    text = f"{type(exc).__qualname__}: {exc}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def decode_error(text: str, candidates: tuple[type[BaseException], ...]) -> BaseException | None:
    """Rebuild a cached exception if its class is among ``candidates``; else ``None``."""
    data = json.loads(text)
    name = data.get("type")
    for cls in candidates:
        if f"{cls.__module__}.{cls.__qualname__}" == name:
            try:
                return cls(*data.get("args", []))
            except Exception:
                return None
    return None
