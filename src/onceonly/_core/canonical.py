# SPDX-License-Identifier: MIT
"""Canonical JSON for fingerprints and content keys.

Two payloads that mean the same get the same bytes: mapping keys are sorted, no
insignificant whitespace is emitted, JSON text is parsed first, and numbers are
normalised (an integral float or Decimal becomes an int, so ``1 == 1.0``).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import math
import uuid
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from onceonly.errors import EncodingError


def _normalise(value: Any) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise EncodingError(f"cannot fingerprint the non-finite number {value!r}")
        return int(value) if value.is_integer() else value
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise EncodingError(f"cannot fingerprint the non-finite number {value!r}")
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                k = str(k)
            out[k] = _normalise(v)
        return out
    if isinstance(value, (list, tuple)):
        return [_normalise(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _normalise(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    raise EncodingError(
        f"cannot fingerprint a {type(value).__name__}; pass fingerprint= (a callable) "
        "or fields= to choose what identifies the payload"
    )


def _parse_text(payload: Any) -> Any:
    """JSON text (str or bytes) is compared by meaning; other text by its exact content."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        raw = bytes(payload)
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return {"$bytes": base64.b64encode(raw).decode("ascii")}
    if isinstance(payload, str):
        try:
            return json.loads(payload)
        except ValueError:
            return {"$text": payload}
    return payload


def canonical_json(payload: Any, fields: Iterable[str] | None = None) -> bytes:
    """The canonical UTF-8 JSON bytes of ``payload`` (see the module docstring).

    Args:
        payload: JSON-like data, a dataclass, or JSON text (str/bytes).
        fields: if given, only these top-level fields of a mapping count; a missing
            field counts as ``null``.

    Raises:
        EncodingError: the payload holds something without a canonical form.
    """
    value = _parse_text(payload)
    if fields is not None:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        if not isinstance(value, Mapping):
            raise EncodingError(f"fields= needs a mapping payload, not {type(value).__name__}")
        value = {name: value.get(name) for name in fields}
    return json.dumps(
        _normalise(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")
