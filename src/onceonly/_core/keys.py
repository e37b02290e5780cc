# SPDX-License-Identifier: MIT
"""Key validation and deterministic key builders (spec §2: keys are 1..255 characters)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from typing import Any

from onceonly._core.canonical import canonical_json
from onceonly.errors import InvalidKey

MAX_KEY_LENGTH = 255


def validate_key(key: object, *, what: str = "key") -> str:
    """Return ``key`` if it is a valid idempotency key, else raise :class:`InvalidKey`.

    A valid key is a ``str`` of 1..255 characters with no control characters
    (C0, DEL, C1) and no lone surrogates (which UTF-8 cannot encode), so that it is
    safe in logs, headers and every store.
    """
    # Fast path, in C: control characters and surrogates are never printable.
    if type(key) is str and key.isprintable() and 0 < len(key) <= MAX_KEY_LENGTH:
        return key
    if not isinstance(key, str):
        raise InvalidKey(f"{what} must be a str, not {type(key).__name__}")
    if not key:
        raise InvalidKey(f"{what} must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(
            f"{what} is {len(key)} characters long; the limit is {MAX_KEY_LENGTH} "
            "(hash long keys with content_key())",
            key=key[:64] + "…",
        )
    for ch in key:
        code = ord(ch)
        if code < 0x20 or 0x7F <= code <= 0x9F:
            raise InvalidKey(f"{what} contains the control character {code:#04x}", key=repr(key))
        if 0xD800 <= code <= 0xDFFF:
            raise InvalidKey(
                f"{what} contains the lone surrogate {code:#06x} (not valid Unicode)",
                key=repr(key),
            )
    return key


def content_key(payload: Any, fields: Iterable[str] | None = None) -> str:
    """SHA-256 of the canonical JSON of ``payload`` (or of the ``fields`` subset of a mapping).

    Key order, whitespace in JSON text and equal numbers (``1`` and ``1.0``) give the
    same key; payloads that mean different things never do (spec §2.2.1). Returns 64
    hexadecimal characters (the hash a scheme-2 fingerprint carries after ``"2:"``).

    Raises:
        EncodingError: the payload cannot be fingerprinted (spec §2.2.2).
    """
    return hashlib.sha256(canonical_json(payload, fields)).hexdigest()


def _escape_part(part: object) -> str:
    if isinstance(part, bool) or part is None:
        raise InvalidKey(f"composite_key parts must be str, int or float, not {part!r}")
    if isinstance(part, float) and not math.isfinite(part):
        raise InvalidKey(f"composite_key parts must be finite, not {part!r}")
    if isinstance(part, int) and part.bit_length() > 4 * MAX_KEY_LENGTH:
        raise InvalidKey("a composite_key part is a number too long for a key")
    text = part if isinstance(part, str) else str(part)
    return text.replace("%", "%25").replace(":", "%3A")


def composite_key(*parts: object) -> str:
    """Join ``parts`` with ``:`` so that different part lists never give the same key.

    ``%`` and ``:`` inside a part are percent-escaped, so ``("a:b", "c")`` and
    ``("a", "b:c")`` give ``a%3Ab:c`` and ``a:b%3Ac``.

    Raises:
        InvalidKey: no parts, an empty part, or a result that is not a valid key.
    """
    if not parts:
        raise InvalidKey("composite_key needs at least one part")
    escaped = [_escape_part(p) for p in parts]
    if any(not p for p in escaped):
        raise InvalidKey("composite_key parts must not be empty")
    return validate_key(":".join(escaped))


def time_window_key(base: str, window_seconds: float, at: float) -> str:
    """The key of ``base`` within the fixed time window that contains epoch second ``at``.

    Two calls in the same window give the same key; windows are aligned to the epoch.
    """
    if not window_seconds > 0:
        raise InvalidKey("the window must be positive")
    position = at / window_seconds
    if not math.isfinite(position):
        raise InvalidKey(f"no window of {window_seconds!r} s holds the time {at!r}")
    bucket = math.floor(position)
    width = f"{window_seconds:g}s"
    return composite_key(validate_key(base, what="base"), width, bucket)
