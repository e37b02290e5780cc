# SPDX-License-Identifier: MIT
"""Errors as text a store can hold (no I/O): the summary in a record's ``error``
column, and a cached exception encoded for replay to duplicates (its class path and
arguments as JSON) and rebuilt only as one of the classes the caller allows.

Never pickle; the text is ASCII or UTF-8 without NUL characters or lone surrogates,
so every store accepts it.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "ERROR_ARG_LIMIT",
    "ERROR_SUMMARY_LIMIT",
    "decode_error",
    "encode_error",
    "error_summary",
]

ERROR_SUMMARY_LIMIT = 2000
"""The default length, in characters, of an error summary."""

ERROR_ARG_LIMIT = 2000
"""The longest text (in characters) kept for one argument of a cached error."""


def _storable(text: str) -> str:
    """``text`` without NUL characters and lone surrogates (escaped as ``\\x00``, ``\\udXXX``)."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _text_of(value: Any, how: Any) -> str | None:
    """``how(value)`` (``str``, ``repr``, ...), or ``None`` when that raises."""
    try:
        text = how(value)
    except Exception:
        return None
    return text if isinstance(text, str) else None


def _class_name(value: Any) -> str:
    return _text_of(type(value), lambda c: c.__qualname__) or "object"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def encode_error(exc: BaseException) -> str:
    """Encode an exception for replay to duplicates: its class path and its arguments.

    Never raises. Arguments JSON cannot hold (or longer than ``ERROR_ARG_LIMIT``
    characters as JSON) are stored as their ``repr``, cut to that limit; long strings
    are cut. The text is ASCII JSON any store can hold.
    """
    cls = type(exc)
    module = _text_of(cls, lambda c: c.__module__) or "builtins"
    name = _storable(f"{module}.{_class_name(exc)}")
    try:
        raw = tuple(exc.args)
    except Exception:
        raw = ()
    args: list[Any] = []
    for arg in raw:
        if isinstance(arg, str):
            args.append(_cut(arg, ERROR_ARG_LIMIT))
            continue
        try:
            text = json.dumps(arg, allow_nan=False)
        except Exception:  # not JSON (TypeError, ValueError), too deep, a broken object
            text = None
        if text is not None and len(text) <= ERROR_ARG_LIMIT:
            args.append(arg)
        else:
            text = _text_of(arg, repr) or f"<unrepresentable {_class_name(arg)}>"
            args.append(_cut(_storable(text), ERROR_ARG_LIMIT))
    try:
        return json.dumps({"type": name, "args": args}, separators=(",", ":"))
    except Exception:  # an argument changed under us; keep the class at least
        return json.dumps({"type": name, "args": []}, separators=(",", ":"))


def error_summary(exc: BaseException, limit: int = ERROR_SUMMARY_LIMIT) -> str:
    """A summary ``"Class: message"`` of ``exc`` for the record's ``error`` column.

    Never raises (an exception whose ``__str__`` fails is summarised by its class).
    NUL characters and lone surrogates are escaped (``\\x00``, ``\\udXXX``) so that every
    store can hold the text, and it is cut to ``limit`` characters with an ellipsis.
    """
    limit = max(limit, 1)
    name = _class_name(exc)
    message = _text_of(exc, str)
    if message is None:
        message = f"<unprintable {name}: str() failed>"
    text = f"{name}: {message[: limit * 2]}"  # bound the work on a huge message
    return _cut(_storable(text), limit)


def decode_error(text: str, candidates: tuple[type[BaseException], ...]) -> BaseException | None:
    """Rebuild a cached exception if its class is among ``candidates``; else ``None``.

    Damaged text, or arguments the class rejects, also give ``None``.
    """
    try:
        data = json.loads(text)
        name = data.get("type")
        args = data.get("args", [])
        if not isinstance(args, list):
            return None
    except (ValueError, TypeError, AttributeError, RecursionError):
        return None
    for cls in candidates:
        if f"{cls.__module__}.{cls.__qualname__}" == name:
            try:
                return cls(*args)
            except Exception:
                return None
    return None
