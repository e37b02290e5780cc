# SPDX-License-Identifier: MIT
"""A transaction's opening and its claim in one round trip, written on libpq's pipeline
directly (no I/O here: a generator that psycopg's ``conn.wait`` drives, sync or async).

psycopg's ``conn.pipeline()`` does the same in Python bookkeeping that costs more than a
loopback round trip saves; these few protocol messages cost less than one statement sent
on its own. Rules:

* **Only the opening of a transaction.** ``BEGIN`` (and/or ``SAVEPOINT``) and the
  store's first statement (the claim) go out with one ``Sync``; every other statement is
  psycopg's as before. After the Sync the connection is back out of pipeline mode, in
  the state the statements left it (in a transaction, or aborted in one).
* **Errors come back as psycopg's own** (:func:`psycopg.errors.error_from_result`), the
  first one of the batch: the store's ``_DriverErrors`` translates them as for any other
  statement; a failed opening leaves the transaction aborted, and the caller rolls back.
* **Typed, text-format parameters**, the same values psycopg would send (``None`` is
  NULL; a NUL character is refused as psycopg refuses it). The statement is prepared on
  the connection (protocol-level, once, in the same round trip as its first use) unless
  the connection turned psycopg's prepared statements off (``prepare_threshold=None``,
  for PgBouncer in transaction mode).
"""

from __future__ import annotations

import functools
import hashlib
import weakref
from collections.abc import Sequence
from typing import Any

from psycopg import errors as e
from psycopg import pq
from psycopg.abc import PQGen
from psycopg.generators import fetch_many, send

__all__ = ["BOOL", "FLOAT8", "INT8", "TEXT", "Opening", "claim_row", "encode_params"]

TEXT, INT8, FLOAT8, BOOL = 25, 20, 701, 16
_NUL = "\x00"
_TEXT_ARRAY = 1009
_TRUE, _FALSE = b"t", b"f"
_FATAL = pq.ExecStatus.FATAL_ERROR
_SQLSTATE = pq.DiagnosticField.SQLSTATE
_NO_STATEMENT = b"26000"  # invalid_sql_statement_name
_DUPLICATE = b"42P05"  # duplicate_prepared_statement

# Names of the statements prepared on each connection (forgotten with the connection).
_prepared: weakref.WeakKeyDictionary[Any, set[bytes]] = weakref.WeakKeyDictionary()


def encode_params(values: Sequence[Any], encoding: str) -> list[bytes | None]:
    """``values`` in PostgreSQL's text format (``None``: NULL). Exact types first: this
    runs for every claim."""
    out: list[bytes | None] = []
    append = out.append
    for v in values:
        t = type(v)
        if t is str:
            if _NUL in v:
                raise e.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
            append(v.encode(encoding))
        elif v is None:
            append(None)
        elif t is bool:
            append(_TRUE if v else _FALSE)
        elif t is int:
            append(b"%d" % v)
        elif t is float:
            append(repr(v).encode())
        else:  # subclasses (an IntEnum, a str subclass): as their base type
            append(encode_params((_plain(v),), encoding)[0])
    return out


def _plain(v: Any) -> Any:
    for base in (bool, str, int, float):
        if isinstance(v, base):
            return base(v)
    raise e.ProgrammingError(f"cannot send a {type(v).__name__} in a claim")


@functools.lru_cache(maxsize=64)
def numbered(query: bytes) -> bytes:
    """The store's ``%s`` placeholders as libpq's ``$1, $2, …`` (its statements hold no
    other ``%``)."""
    parts = query.split(b"%s")
    assert all(b"%" not in part for part in parts), "a % that is not a placeholder"
    out = [parts[0]]
    for n, part in enumerate(parts[1:], 1):
        out.append(b"$%d" % n)
        out.append(part)
    return b"".join(out)


@functools.lru_cache(maxsize=64)
def statement_name(query: bytes) -> bytes:
    return b"onceonly_" + hashlib.sha1(query, usedforsecurity=False).hexdigest()[:20].encode()


class Opening:
    """The commands that open a transaction (``BEGIN``, ``SAVEPOINT …``) and one
    statement, sent with a single Sync; :meth:`run` is the generator."""

    __slots__ = ("commands", "params", "prepare", "query", "types")

    def __init__(
        self,
        commands: Sequence[bytes],
        query: bytes,
        params: list[bytes | None],
        types: Sequence[int],
        prepare: bool,
    ) -> None:
        self.commands = commands
        self.query = numbered(query)
        self.params = params
        self.types = types
        self.prepare = prepare

    def run(self, conn: Any) -> PQGen[pq.abc.PGresult]:
        """Send everything, read every result; the statement's result (or raise the
        first error). The connection leaves pipeline mode whatever happens."""
        pgconn = conn.pgconn
        name = b""
        known: set[bytes] | None = None
        if self.prepare:
            name = statement_name(self.query)
            known = _prepared.get(conn)
            if known is None:
                known = _prepared[conn] = set()
        pgconn.enter_pipeline_mode()
        try:
            for command in self.commands:
                pgconn.send_query_params(command, None)
            parsing = known is not None and name not in known
            if parsing:
                pgconn.send_prepare(name, self.query, self.types)
            if self.prepare:
                pgconn.send_query_prepared(name, self.params)
            else:
                pgconn.send_query_params(self.query, self.params, self.types)
            pgconn.pipeline_sync()
            yield from send(pgconn)
            results: list[list[pq.abc.PGresult]] = []
            expected = len(self.commands) + (2 if parsing else 1) + 1  # + the Sync
            while len(results) < expected:
                results.append((yield from fetch_many(pgconn)))
        finally:
            if pgconn.pipeline_status != pq.PipelineStatus.OFF:
                try:
                    pgconn.exit_pipeline_mode()
                except e.OperationalError:
                    pgconn.finish()  # results left unread: the connection is unusable
        encoding = conn.info.encoding
        if parsing and known is not None:
            parse = results[len(self.commands)][0]
            if parse.status == pq.ExecStatus.COMMAND_OK:
                known.add(name)
        for group in results:
            for result in group:
                if result.status == _FATAL:
                    state = result.error_field(_SQLSTATE)
                    if known is not None and state == _NO_STATEMENT:
                        known.discard(name)  # deallocated (psycopg's rollback): parse again
                    elif known is not None and state == _DUPLICATE:
                        known.add(name)  # still there after all: no need to parse
                    raise e.error_from_result(result, encoding=encoding)
        return results[-2][0]


def claim_row(result: pq.abc.PGresult, conn: Any) -> tuple[Any, ...] | None:
    """A claim's row as psycopg would load it: ``(now, record text[] or None)``."""
    if result.ntuples == 0:
        return None
    now, record = result.get_value(0, 0), result.get_value(0, 1)
    stamp = None if now is None else float(now)
    if record is None:
        return (stamp, None)
    loader = conn.adapters.get_loader(_TEXT_ARRAY, pq.Format.TEXT)
    return (stamp, loader(_TEXT_ARRAY, conn).load(record))
