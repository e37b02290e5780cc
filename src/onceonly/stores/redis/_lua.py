# SPDX-License-Identifier: MIT
"""The Redis store's Lua scripts and the pure helpers around them (no I/O).

One hash per record, under one key per ``(scope, key)``::

    {prefix}{<len(scope)>:<scope>:<key>}

The braces make the whole identity the Cluster hash tag, and the length prefix keeps
``("a:b", "c")`` and ``("a", "b:c")`` apart. Every script touches that one key only, so
each operation is a single ``EVALSHA`` on whichever node holds it.

Invariants the scripts keep:

* **Time is the server's** (``TIME`` inside the script), kept as integer microseconds
  in the hash (exact in Lua's doubles until the year 2255) and turned into epoch seconds
  here. No client clock is ever written.
* The scripts do **compare-and-set only**: what to write is decided in Python by
  ``onceonly._core.state`` (``decide`` and the ``*_write`` helpers); ``UPDATE`` re-checks
  the :class:`~onceonly._core.state.Expect` of that decision (``Expect.matches`` in Lua:
  token, state and, with ``lapsed``, a lapsed lease or expiry on the server's clock) and
  stores the whole new record, or nothing.
* Tokens are 63-bit integers: compared as strings, never as Lua numbers.
* Each script answers one JSON text ``[status, now, value]`` (``now`` as a string of
  microseconds): the client decodes it in C, where nested RESP replies are parsed
  element by element in Python (a third of a replay's time).
* A completed record with a ttl gets ``expires_at`` in the hash **and** ``PEXPIREAT`` at
  the same instant, both from the script's ``TIME``. Readers decide from ``expires_at``
  (``decide`` checks it on the store's now), never from Redis having removed the key.
  Every other write replaces the hash, which drops any earlier expiry.
* ``keep_checkpoint`` keeps the checkpoint the hash holds when the script runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from json.encoder import encode_basestring
from typing import Any

from onceonly._core.state import Record, State, Write
from onceonly.errors import ConfigurationError, CorruptRecord

__all__ = [
    "CLAIM",
    "GET",
    "RENEW",
    "SAVE_CHECKPOINT",
    "SCRIPTS",
    "UPDATE",
    "check_prefix",
    "parse_record",
    "parse_reply",
    "record_key",
    "seconds",
    "sha1",
    "write_arg",
    "written",
]

_PRELUDE = """
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function fmt(n) return string.format('%.0f', n) end
-- Every script answers one JSON text, [status, now, value]: decoded in C by the client,
-- where a reply of nested RESP elements is parsed element by element.
local function reply(status, now, value)
  return cjson.encode({status, fmt(now), value})
end
-- Replace the record at k by the write packed as JSON in ARGV[i] (see write_arg):
-- created_at carried over, times stamped from now; with keep, the checkpoint the hash
-- held (``old_cp``, when the record existed) instead of the written one. Answers
-- {created_at, the kept checkpoint or false}: the client builds the record from its
-- write (``written``), so the hash is not read back.
local function put(k, i, now, created, existed, old_cp)
  local w = cjson.decode(ARGV[i])
  local lease, ttl, completed, keep = w[1], w[2], w[3], w[4]
  local keep_old = keep == '1' and existed
  local f = {'created_at', fmt(created), 'updated_at', fmt(now)}
  for j = 5, #w, 2 do
    if not (keep_old and w[j] == 'checkpoint') then
      f[#f + 1] = w[j]
      f[#f + 1] = w[j + 1]
    end
  end
  if keep_old and old_cp then
    f[#f + 1] = 'checkpoint'
    f[#f + 1] = old_cp
  end
  if lease ~= '' then
    f[#f + 1] = 'lease_until'
    f[#f + 1] = fmt(now + tonumber(lease))
  end
  if completed == '1' then
    f[#f + 1] = 'completed_at'
    f[#f + 1] = fmt(now)
  end
  local expires = nil
  if ttl ~= '' then
    expires = now + tonumber(ttl)
    f[#f + 1] = 'expires_at'
    f[#f + 1] = fmt(expires)
  end
  if existed then
    redis.call('DEL', k)
  end
  redis.call('HSET', k, unpack(f))
  if expires then
    redis.call('PEXPIREAT', k, fmt(math.ceil(expires / 1000)))
  end
  return {fmt(created), keep_old and (old_cp or false) or false}
end
"""

#: Insert the write (ARGV[1]) if the key is absent: ``{1, now, put's answer}``; else the
#: record there: ``{0, now, record}``.
CLAIM = (
    _PRELUDE
    + """
local k = KEYS[1]
local now = now_us()
local h = redis.call('HGETALL', k)
if #h > 0 then
  return reply(0, now, h)
end
return reply(1, now, put(k, 1, now, now, false, nil))
"""
)

#: ``{0, now, record}`` (an empty record when the key is absent).
GET = (
    _PRELUDE
    + """
return reply(0, now_us(), redis.call('HGETALL', KEYS[1]))
"""
)

#: ARGV: expected token, expected state, lapsed ('1'/'0'), the write.
#: Stores the write only if the record is still that version (Expect.matches):
#: ``{1, now, put's answer}``, else ``{0, now}``.
UPDATE = (
    _PRELUDE
    + """
local k = KEYS[1]
local now = now_us()
local cur = redis.call('HMGET', k, 'token', 'state', 'lease_until', 'expires_at',
                       'created_at', 'checkpoint')
if not cur[1] or cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] then return reply(0, now) end
if ARGV[3] == '1' then
  if cur[2] == 'completed' then
    if not cur[4] or tonumber(cur[4]) > now then return reply(0, now) end
  elseif cur[3] and tonumber(cur[3]) > now then
    return reply(0, now)
  end
end
return reply(1, now, put(k, 4, now, tonumber(cur[5]) or now, true, cur[6]))
"""
)

#: ARGV: token, lease (µs). Extends an in_progress claim held under token:
#: ``{1, now, lease_until}``, else ``{0, now}``.
RENEW = (
    _PRELUDE
    + """
local k = KEYS[1]
local now = now_us()
local cur = redis.call('HMGET', k, 'token', 'state')
if cur[1] ~= ARGV[1] or cur[2] ~= 'in_progress' then return reply(0, now) end
local lease_until = now + tonumber(ARGV[2])
redis.call('HSET', k, 'lease_until', fmt(lease_until))
return reply(1, now, fmt(lease_until))
"""
)

#: ARGV: token, checkpoint text, lease (µs, '' to keep the lease). ``{1, now}`` when
#: stored on the in_progress claim held under token, else ``{0, now}``.
SAVE_CHECKPOINT = (
    _PRELUDE
    + """
local k = KEYS[1]
local now = now_us()
local cur = redis.call('HMGET', k, 'token', 'state')
if cur[1] ~= ARGV[1] or cur[2] ~= 'in_progress' then return reply(0, now) end
redis.call('HSET', k, 'checkpoint', ARGV[2], 'updated_at', fmt(now))
if ARGV[3] ~= '' then
  redis.call('HSET', k, 'lease_until', fmt(now + tonumber(ARGV[3])))
end
return reply(1, now)
"""
)

#: Every script by the name the store calls it by.
SCRIPTS = {
    "claim": CLAIM,
    "get": GET,
    "update": UPDATE,
    "renew": RENEW,
    "save_checkpoint": SAVE_CHECKPOINT,
}


def sha1(script: str) -> bytes:
    """The SHA1 Redis names ``script`` by (``EVALSHA``'s first argument), as sent."""
    return hashlib.sha1(script.encode()).hexdigest().encode()


def check_prefix(prefix: object) -> str:
    """``prefix`` if usable as a key prefix, else :class:`ConfigurationError`.

    Braces are refused: a ``{`` in the prefix would become the Cluster hash tag and put
    every record in one slot.
    """
    if not isinstance(prefix, str):
        raise ConfigurationError(f"prefix must be a str, not {type(prefix).__name__}")
    if "{" in prefix or "}" in prefix:
        raise ConfigurationError(f"the key prefix {prefix!r} must not contain braces")
    if len(prefix) > 200 or any(ord(ch) < 0x20 for ch in prefix):
        raise ConfigurationError(
            f"the key prefix {prefix!r} must be at most 200 printable characters"
        )
    return prefix


def record_key(prefix: str, scope: str, key: str) -> str:
    """The Redis key of the record ``(scope, key)`` under ``prefix``:
    ``{prefix}{<len(scope)>:<scope>:<key>}``, its braces one Cluster hash tag per record
    (the length keeps ``("a:b", "c")`` and ``("a", "b:c")`` apart)."""
    return f"{prefix}{{{len(scope)}:{scope}:{key}}}"


def micros(value: float) -> str:
    """Seconds as integer microseconds, the unit of every time in the hash."""
    return str(round(value * 1_000_000))


def seconds(value: str | int) -> float:
    """Integer microseconds (as the scripts return them) as epoch seconds."""
    return int(value) / 1_000_000


def write_arg(write: Write) -> str:
    """``write`` as the scripts read it: one JSON array of strings (one argument to
    pack and send, decoded by ``cjson`` in the script), holding lease, ttl (µs, '' for
    none), completed, keep_checkpoint ('1'/'0'), then field name/value pairs.

    Built by hand (this runs on every claim and completion): the numbers, flags and the
    state need no escaping; every other value is quoted by ``json``'s own string encoder,
    so the text is what ``json.dumps(list, ensure_ascii=False)`` gives.
    """
    lease, ttl = write.lease_seconds, write.ttl_seconds
    parts = [
        '["',
        "" if lease is None else micros(lease),
        '","',
        "" if ttl is None else micros(ttl),
        '","1","' if write.completed else '","0","',
        '1","state","' if write.keep_checkpoint else '0","state","',
        write.state.value,
        '","token","',
        str(write.token),
        '","attempts","',
        str(write.attempts),
        '"',
    ]
    for name, value in (
        (',"fingerprint",', write.fingerprint),
        (',"result",', write.result),
        (',"error",', write.error),
        (',"payload",', write.payload),
        (',"checkpoint",', write.checkpoint),
    ):
        if value is not None:
            parts += (name, encode_basestring(value))
    parts.append("]")
    return "".join(parts)


def written(
    scope: str, key: str, write: Write, now: int, answer: Sequence[Any], *, existed: bool
) -> Record:
    """The record a script's ``put`` stored for ``write`` at ``now`` (µs), from its answer
    ``[created_at, kept checkpoint or false]``: the same arithmetic as the script's, on
    integer microseconds, so it equals the hash field for field."""
    lease = None if write.lease_seconds is None else int(micros(write.lease_seconds))
    ttl = None if write.ttl_seconds is None else int(micros(write.ttl_seconds))
    kept = answer[1] if isinstance(answer[1], str) else None
    return Record(
        scope=scope,
        key=key,
        state=write.state,
        fingerprint=write.fingerprint,
        token=write.token,
        attempts=write.attempts,
        lease_until=None if lease is None else (now + lease) / 1_000_000,
        result=write.result,
        error=write.error,
        payload=write.payload,
        checkpoint=kept if write.keep_checkpoint and existed else write.checkpoint,
        created_at=int(answer[0]) / 1_000_000,
        updated_at=now / 1_000_000,
        completed_at=now / 1_000_000 if write.completed else None,
        expires_at=None if ttl is None else (now + ttl) / 1_000_000,
    )


def parse_reply(reply: Any, scope: str, key: str) -> list[Any]:
    """A script's JSON reply: ``[status, now, value]`` (``value`` may be absent).

    Raises:
        CorruptRecord: not JSON text (a hash holding bytes that are not UTF-8).
    """
    try:
        out = json.loads(reply)
    except (ValueError, TypeError) as exc:
        raise CorruptRecord(
            f"the Redis hash of this record is not one onceonly wrote ({exc})",
            scope=scope,
            key=key,
        ) from None
    assert isinstance(out, list)
    return out


def parse_record(scope: str, key: str, flat: Sequence[Any]) -> Record | None:
    """The record of an ``HGETALL`` reply (``None`` when empty).

    Raises:
        CorruptRecord: a hash this store did not write (unknown state, missing fields).
    """
    if not flat:  # HGETALL of a missing key: [] (or {} from cjson, for an empty table)
        return None
    h = dict(zip(flat[::2], flat[1::2], strict=False))  # str already: decoded JSON
    get = h.get
    try:
        lease_until = get("lease_until")
        created_at = get("created_at")
        updated_at = get("updated_at")
        completed_at = get("completed_at")
        expires_at = get("expires_at")
        return Record(
            scope,
            key,
            State.parse(h["state"], key=key),
            get("fingerprint"),
            int(h["token"]),
            int(h["attempts"]),
            None if lease_until is None else int(lease_until) / 1_000_000,
            get("result"),
            get("error"),
            get("payload"),
            get("checkpoint"),
            0.0 if created_at is None else int(created_at) / 1_000_000,
            0.0 if updated_at is None else int(updated_at) / 1_000_000,
            None if completed_at is None else int(completed_at) / 1_000_000,
            None if expires_at is None else int(expires_at) / 1_000_000,
        )
    except (KeyError, ValueError) as exc:
        raise CorruptRecord(
            f"the Redis hash of this record is not one onceonly wrote ({exc!r})",
            scope=scope,
            key=key,
        ) from None
