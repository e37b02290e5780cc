# SPDX-License-Identifier: MIT
"""Round trips and statements per call of ``@onceonly.idempotent`` (leased mode) on PostgreSQL.

The counts are taken on the wire: the store connects through a small TCP proxy that
decodes the PostgreSQL frontend/backend protocol. For every call it records

* **statements**: ``Execute`` and simple ``Query`` messages the client sent, with their
  SQL (``Parse`` text, looked up through ``Bind`` for prepared statements);
* **round trips**: ``ReadyForQuery`` messages the server sent back. The server sends
  exactly one per ``Sync`` / simple ``Query``, and the client waits for it, so this is
  the number of times the call waits for the network, pipelined statements included;
* **store operations**: calls of the session methods (``claim``, ``update``, ``get``, …),
  counted by wrapping the session class, so each can be matched to its statement.

Prepared-statement creation (psycopg prepares a statement on its 5th execution, one
extra round trip per connection and statement) is excluded by a warm-up. Then the same
calls are timed without the proxy (calls/s). For comparison, the atomic-mode inbox and
its hand-written baseline (see ``bench/inbox_pg.py``) are traced the same way.

    .venv/bin/python bench/leased_roundtrips.py [--url URL] [--calls 200] [--seconds 2]

This is a benchmark, not a test: it prints numbers; the tables are dropped at the end.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import inspect
import os
import re
import secrets
import socket
import statistics
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

import onceonly
from onceonly.inbox import Tx
from onceonly.stores.postgres import _store as pg_store

DEFAULT_URL = os.environ.get(
    "ONCEONLY_BENCH_PG",
    os.environ.get("ONCEONLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"),
)
# Protocol codes of the untyped first messages a client may send.
_SSL_REQUEST, _GSSENC_REQUEST, _CANCEL_REQUEST = 80877103, 80877104, 80877102
_CONTROL = re.compile(r"(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE)\b", re.IGNORECASE)
SESSION_METHODS = ("claim", "get", "insert", "update", "renew", "save_checkpoint", "execute")


# -- the wire: a counting PostgreSQL protocol proxy


@dataclass
class Event:
    """One protocol event: a statement sent by the client or a ReadyForQuery received."""

    conn: int
    kind: str  # "stmt" | "ready"
    sql: str = ""


@dataclass
class _Stream:
    """Reassembles one direction of one connection into protocol messages."""

    typed: bool
    buf: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> Iterator[tuple[str, bytes]]:
        self.buf += data
        while True:
            if not self.typed:  # the untyped startup message: int32 length, int32 code
                if len(self.buf) < 8:
                    return
                length = int.from_bytes(self.buf[0:4], "big")
                if len(self.buf) < length:
                    return
                code = int.from_bytes(self.buf[4:8], "big")
                if code in (_SSL_REQUEST, _GSSENC_REQUEST, _CANCEL_REQUEST):
                    raise RuntimeError("connect with sslmode=disable and gssencmode=disable")
                del self.buf[:length]
                self.typed = True
                yield "startup", b""
                continue
            if len(self.buf) < 5:
                return
            length = int.from_bytes(self.buf[1:5], "big")
            if len(self.buf) < 1 + length:
                return
            kind = chr(self.buf[0])
            body = bytes(self.buf[5 : 1 + length])
            del self.buf[: 1 + length]
            yield kind, body


class WireCounter:
    """A TCP proxy to PostgreSQL that logs statements and ReadyForQuery per connection."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.events: list[Event] = []
        self._lock = threading.Lock()
        self._ids = 0
        self._streams: dict[tuple[int, str], _Stream] = {}
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, name="wire-accept", daemon=True).start()

    def url(self, url: str) -> str:
        """``url`` pointed at the proxy (TLS and GSS off, so the protocol is readable)."""
        parts = urllib.parse.urlsplit(url)
        user = f"{parts.username}@" if parts.username else ""
        if parts.password:
            user = f"{parts.username}:{parts.password}@"
        query = dict(urllib.parse.parse_qsl(parts.query))
        query.update(sslmode="disable", gssencmode="disable")
        netloc = f"{user}127.0.0.1:{self.port}"
        return urllib.parse.urlunsplit(
            (parts.scheme, netloc, parts.path, urllib.parse.urlencode(query), "")
        )

    def mark(self) -> int:
        with self._lock:
            return len(self.events)

    def since(self, mark: int) -> list[Event]:
        with self._lock:
            return self.events[mark:]

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._ids += 1
                cid = self._ids
            named: dict[str, str] = {}  # prepared statement name -> SQL
            portals: dict[str, str] = {}  # portal -> SQL
            up = functools.partial(self._client_messages, cid, named, portals)
            down = functools.partial(self._server_messages, cid)
            for src, dst, parse in ((client, server, up), (server, client, down)):
                threading.Thread(
                    target=self._pump, args=(src, dst, parse), name="wire-pump", daemon=True
                ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, parse: Callable[[bytes], None]) -> None:
        try:
            while data := src.recv(65536):
                parse(data)  # log before forwarding: the reply cannot overtake the log
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _client_messages(
        self, cid: int, named: dict[str, str], portals: dict[str, str], data: bytes
    ) -> None:
        stream = self._streams.setdefault((cid, "up"), _Stream(typed=False))
        for kind, body in stream.feed(data):
            if kind == "P":  # Parse: name \0 query \0 ...
                name, _, rest = body.partition(b"\0")
                named[name.decode()] = rest.partition(b"\0")[0].decode(errors="replace")
            elif kind == "B":  # Bind: portal \0 statement \0 ...
                portal, _, rest = body.partition(b"\0")
                portals[portal.decode()] = named.get(rest.partition(b"\0")[0].decode(), "?")
            elif kind == "E":  # Execute: portal \0 max rows
                self._log(Event(cid, "stmt", portals.get(body.partition(b"\0")[0].decode(), "?")))
            elif kind == "Q":  # simple Query
                self._log(Event(cid, "stmt", body.rstrip(b"\0").decode(errors="replace")))

    def _server_messages(self, cid: int, data: bytes) -> None:
        stream = self._streams.setdefault((cid, "down"), _Stream(typed=True))
        for kind, _ in stream.feed(data):
            if kind == "Z":  # ReadyForQuery
                self._log(Event(cid, "ready"))

    def _log(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)


def upstream(url: str) -> tuple[str, int]:
    info = psycopg.conninfo.conninfo_to_dict(url)
    host = str(info.get("host") or "127.0.0.1")
    if host.startswith("/"):
        raise SystemExit("the round-trip counter needs a TCP host in the URL, not a socket")
    return host, int(info.get("port") or 5432)


# -- store operations: wrap the session class


class OpCounter:
    """Counts calls of the PostgreSQL session's methods (sync store)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._saved: dict[str, Any] = {}

    @contextlib.contextmanager
    def installed(self) -> Iterator[OpCounter]:
        cls = pg_store.PostgresSession
        for name in SESSION_METHODS:
            original = getattr(cls, name)
            self._saved[name] = original
            setattr(cls, name, self._wrap(name, original))
        try:
            yield self
        finally:
            for name, original in self._saved.items():
                setattr(cls, name, original)

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return original(*args, **kwargs)

        return counted


# -- what one call costs


@dataclass
class Cost:
    """Statements, round trips and store operations of one call."""

    statements: list[str]
    round_trips: int
    ops: list[str]

    def shape(self) -> tuple[tuple[str, ...], int, tuple[str, ...]]:
        return tuple(self.statements), self.round_trips, tuple(self.ops)


def trace(wire: WireCounter, ops: OpCounter, call: Callable[[], object]) -> Cost:
    mark, op_mark = wire.mark(), len(ops.calls)
    call()
    # The last ReadyForQuery may still be in the proxy's pump: let it land.
    deadline = time.monotonic() + 1.0
    events = wire.since(mark)
    while time.monotonic() < deadline:
        time.sleep(0.005)
        later = wire.since(mark)
        if len(later) == len(events):
            break
        events = later
    statements = [summarise(e.sql) for e in events if e.kind == "stmt"]
    trips = sum(1 for e in events if e.kind == "ready")
    return Cost(statements, trips, ops.calls[op_mark:])


def summarise(text: str, width: int = 60) -> str:
    """A statement's SQL on one line: short ones whole, long ones as head + what they write."""
    words = " ".join(text.split())
    if len(words) <= width:
        return words
    dml = re.search(r"\b(INSERT INTO|UPDATE|DELETE FROM)\s+(\"?[\w.]+\"?)", words)
    what = f" [{dml.group(1)} {dml.group(2)}]" if dml else ""
    return f"{words[: width - 1]}…{what} ({len(words)} chars)"


@dataclass
class Tally:
    """The costs of many calls of one kind."""

    name: str
    costs: list[Cost] = field(default_factory=list)

    def report(self) -> None:
        shapes = collections.Counter(c.shape() for c in self.costs)
        n = len(self.costs)
        stmts = statistics.mean(len(c.statements) for c in self.costs)
        trips = statistics.mean(c.round_trips for c in self.costs)
        print(f"\n{self.name}: {n} calls, {stmts:.2f} statements and {trips:.2f} round trips each")
        n_ops = sum(len(c.ops) for c in self.costs)
        if n_ops:  # transaction control (BEGIN, COMMIT, …) is not a store operation
            work = sum(1 for c in self.costs for s in c.statements if not _CONTROL.match(s))
            print(
                f"  {n_ops / n:.2f} store operations each; statements per operation "
                f"(transaction control aside): {work / n_ops:.2f}"
            )
        for (statements, round_trips, ops), count in shapes.most_common():
            print(
                f"  {count}x: {round_trips} round trip(s), {len(statements)} statement(s); "
                f"store operations: {', '.join(ops) or '-'}"
            )
            for s in statements:
                print(f"      {s}")

    @property
    def max_trips(self) -> int:
        return max(c.round_trips for c in self.costs)


def rate(call: Callable[[int], object], seconds: float, repeat: int) -> tuple[float, int, float]:
    """Median calls/s of ``call(i)`` over ``repeat`` runs of ``seconds``; the calls made;
    and the median client CPU time (user + system, this process) per call in µs."""
    results, cpu = [], []
    i = 0
    for _ in range(repeat):
        n, start, cpu_start = 0, time.perf_counter(), time.process_time()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            call(i)
            i += 1
            n += 1
        results.append(n / (time.perf_counter() - start))
        cpu.append((time.process_time() - cpu_start) / n * 1e6)
    return statistics.median(results), i, statistics.median(cpu)


# -- the scenarios


def drop(url: str, tables: Sequence[str], components: Sequence[str]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for name in tables:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
        if conn.execute("SELECT to_regclass('onceonly_schema')").fetchone() != (None,):
            conn.execute(
                "DELETE FROM onceonly_schema WHERE component = ANY(%s)", (list(components),)
            )


def leased(url: str, table: str, run: str) -> tuple[Callable[[str], object], Any]:
    """An ``@idempotent`` function on a fresh store; returns (call, store)."""
    store = onceonly.open_store(url, table=table, min_size=1, max_size=1)
    store.migrate()

    @onceonly.idempotent(
        store, key=lambda order_id: f"charge:{run}:{order_id}", scope="bench.charge"
    )
    def charge(order_id: str) -> dict[str, str]:
        return {"payment": f"pay-{order_id}"}

    return charge, store


def create_ledger(url: str, ledger: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (id text PRIMARY KEY, amount bigint)").format(
                sql.Identifier(ledger)
            )
        )


def pipeline_modes() -> list[bool | None]:
    """The store's ``pipeline=`` settings to trace: off and on if it has the option."""
    params = inspect.signature(pg_store.PostgresStore).parameters
    return [False, True] if "pipeline" in params else [None]


def inbox(
    url: str, table: str, ledger: str, pipeline: bool | None
) -> tuple[Callable[[str], object], Any]:
    """An atomic-mode inbox with one business insert per message; returns (call, store)."""
    create_ledger(url, ledger)
    options: dict[str, Any] = {} if pipeline is None else {"pipeline": pipeline}
    store = onceonly.open_store(url, table=table, min_size=1, max_size=1, **options)
    store.migrate()
    box = onceonly.Inbox(store, consumer="bench")
    insert = f"INSERT INTO {ledger} (id, amount) VALUES (?, ?)"

    def handler(payload: dict[str, Any], tx: Tx) -> None:
        tx.execute(insert, (payload["id"], payload["amount"]))

    def call(key: str) -> object:
        return box.process(key, {"id": key, "amount": 1}, handler)

    return call, store


def baseline(url: str, table: str, ledger: str) -> tuple[Callable[[str], object], Any]:
    """The hand-written transaction of bench/inbox_pg.py; returns (call, connection)."""
    create_ledger(url, ledger)
    conn = psycopg.connect(url)
    claim = (
        sql.SQL(
            "INSERT INTO {} (scope, key, state, token, completed_at) "
            "VALUES (%s, %s, 'completed', 0, now()) ON CONFLICT (scope, key) DO NOTHING"
        )
        .format(sql.Identifier(table))
        .as_bytes(None)
    )
    insert = (
        sql.SQL("INSERT INTO {} (id, amount) VALUES (%s, %s)")
        .format(sql.Identifier(ledger))
        .as_bytes(None)
    )

    def call(key: str) -> object:
        if conn.execute(claim, ("bench", key)).rowcount == 1:
            conn.execute(insert, (key, 1))
        conn.commit()
        return None

    return call, conn


def count(
    wire: WireCounter,
    ops: OpCounter,
    name: str,
    call: Callable[[str], object],
    calls: int,
    run: str,
) -> tuple[Tally, Tally]:
    """Warm up, then trace ``calls`` new keys and ``calls`` replays of them."""
    for i in range(10):  # prepared statements, pool connection
        call(f"{run}-warm-{i}")
        call(f"{run}-warm-{i}")
    new, replay = Tally(f"{name}, new key"), Tally(f"{name}, replay")
    for i in range(calls):
        new.costs.append(trace(wire, ops, functools.partial(call, f"{run}-{i}")))
    for i in range(calls):
        replay.costs.append(trace(wire, ops, functools.partial(call, f"{run}-{i}")))
    return new, replay


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", default=DEFAULT_URL, help="PostgreSQL URL (default: %(default)s)")
    parser.add_argument("--calls", type=int, default=200, help="traced calls per kind (200)")
    parser.add_argument("--seconds", type=float, default=2.0, help="per timing run (2)")
    parser.add_argument("--repeat", type=int, default=3, help="timing runs, median (3)")
    args = parser.parse_args(argv)
    url: str = args.url

    suffix = f"{os.getpid()}_{secrets.token_hex(3)}"
    leased_table, inbox_table = f"bench_leased_{suffix}", f"bench_inbox_{suffix}"
    claims_table, ledger = f"bench_claims_{suffix}", f"bench_ledger_{suffix}"
    base_ledger = f"bench_base_ledger_{suffix}"
    tables = [leased_table, inbox_table, claims_table, ledger, base_ledger]
    components = [f"records:{t}" for t in (leased_table, inbox_table, claims_table)]
    host, port = upstream(url)
    wire = WireCounter(host, port)
    proxied = wire.url(url)
    ops = OpCounter()
    closers: list[Callable[[], object]] = []
    run = secrets.token_hex(3)
    try:
        # 1. Counts, through the proxy.
        charge, store = leased(proxied, leased_table, run)
        closers.append(store.close)
        boxes = []
        for pipeline in pipeline_modes():
            box, box_store = inbox(proxied, inbox_table, ledger, pipeline)
            closers.append(box_store.close)
            label = "" if pipeline is None else f", pipeline={pipeline}"
            boxes.append((f"Inbox.process (atomic{label})", box))
        claims = onceonly.open_store(url, table=claims_table, min_size=1, max_size=1)
        claims.migrate()  # same schema and indexes as onceonly's records
        claims.close()
        base, base_conn = baseline(proxied, claims_table, base_ledger)
        closers.append(base_conn.close)
        with ops.installed():
            lnew, lreplay = count(wire, ops, "@idempotent (leased)", charge, args.calls, "l")
            atomic: list[Tally] = []
            for i, (name, box) in enumerate(boxes):
                atomic.extend(count(wire, ops, name, box, args.calls, f"i{i}"))
            bnew, breplay = count(wire, ops, "hand-written baseline", base, args.calls, "b")
        for closer in reversed(closers):
            closer()
        closers.clear()

        print(f"PostgreSQL at {host}:{port}, psycopg {psycopg.__version__}; counted on the wire")
        print("(statements = Execute/Query messages; round trips = ReadyForQuery replies)")
        print("\n== leased mode: @onceonly.idempotent on a sync function ==")
        lnew.report()
        lreplay.report()
        ok = lnew.max_trips <= 2 and lreplay.max_trips <= 1
        print(f"\ntarget: <= 2 round trips per new key, <= 1 per replay: {ok}")
        print("\n== for comparison: atomic mode (bench/inbox_pg.py) ==")
        for tally in (*atomic, bnew, breplay):
            tally.report()

        # 2. Timings, direct (the proxy would add its own latency).
        charge, store = leased(url, f"{leased_table}_t", run)
        closers.append(store.close)
        components.append(f"records:{leased_table}_t")
        tables.append(f"{leased_table}_t")
        conn = psycopg.connect(url, autocommit=True)
        closers.append(conn.close)
        for i in range(10):
            charge(f"warm-{i}")
            conn.execute("SELECT 1")
        new_rate, done, new_cpu = rate(lambda i: charge(f"t-{i}"), args.seconds, args.repeat)
        replay_rate, _, replay_cpu = rate(
            lambda i: charge(f"t-{i % done}"), args.seconds, args.repeat
        )
        select_rate, _, select_cpu = rate(
            lambda i: conn.execute("SELECT 1"), args.seconds, args.repeat
        )
        print(
            f"\n== timings (direct connection, median of {args.repeat} x {args.seconds:g} s, "
            "one thread) =="
        )
        each = "µs client CPU each"
        print(f"  @idempotent, new key : {new_rate:8,.0f} calls/s, {new_cpu:6.0f} {each}")
        print(f"  @idempotent, replay  : {replay_rate:8,.0f} calls/s, {replay_cpu:6.0f} {each}")
        print(
            f"  reference: SELECT 1  : {select_rate:8,.0f} round trips/s (autocommit), "
            f"{select_cpu:6.0f} {each}"
        )
    finally:
        for closer in reversed(closers):
            try:
                closer()
            except Exception as exc:  # cleanup must go on
                print(f"cleanup: {exc}", file=sys.stderr)
        wire.close()
        drop(url, tables, components)
    return 0


if __name__ == "__main__":
    sys.exit(main())
