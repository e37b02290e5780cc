# SPDX-License-Identifier: MIT
"""The reference model of DESIGN §2 and the store harnesses shared by the model tests.

``Model`` is written from DESIGN §2 alone; it does not use ``onceonly._core.state``. A
``Harness`` gives a fresh store per example and a way to move its clock: an injected
:class:`~onceonly.testing.ManualClock` for memory and SQLite, and for PostgreSQL (whose
clock is the server's) shifting the stored times back.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

import onceonly
from onceonly._core.fingerprint import fingerprint
from onceonly._core.state import Record
from onceonly.stores.memory import MemoryStore
from onceonly.stores.sqlite import SQLiteStore
from onceonly.testing import ManualClock
from tests.conftest import (
    MYSQL_URL,
    PG_URL,
    REDIS_URL,
    _mysql_connect,
    drop_mysql_table,
    drop_pg_table,
    drop_redis_prefix,
)

SCOPE = "billing"
KEYS = ("k1", "ключ:2")
LEASE = 30.0
TTL = 100.0
MAX_ATTEMPTS = 3
# Steps of time: all whole seconds, so a live lease or record has >= 7 s left in the
# model, which leaves room for the real clock of PostgreSQL to move during an example.
ADVANCES = (10.0, LEASE + 1, LEASE + 1, TTL + 1)
PAYLOADS = st.sampled_from((0, 0, 0, 1))  # mostly the same payload: fewer mismatches

IN_PROGRESS, COMPLETED, FAILED, DEAD = "in_progress", "completed", "failed", "dead"


def payload_of(key: str, p: int) -> dict[str, Any]:
    """Payload number ``p`` (0 or 1) of ``key``: two payloads per key."""
    return {"id": key, "amount": 100 * (p + 1)}


# -- the reference model


@dataclasses.dataclass
class Row:
    """The model's record of one key."""

    state: str
    payload: int
    attempts: int
    token: int  # model token id; a new one for every claim taken
    generation: int  # a new one each time the key is claimed afresh (absent / expired)
    lease_until: float | None = None
    expires_at: float | None = None
    result: Any = None
    attempt: int = 0  # completed: the attempt that produced the result
    checkpoint: dict[str, Any] = dataclasses.field(default_factory=dict)
    snapshot: Any = None  # failed/dead: the payload kept for redrive (None: not checked)
    error: str | None = None  # failed/dead: how the error summary starts


@dataclasses.dataclass(frozen=True)
class Prediction:
    """What a delivery of a key must do, per DESIGN §2."""

    action: str  # run | replay | mismatch | dead | in_flight
    attempts: int = 0  # run: failed attempts so far; dead: attempts reported
    attempt: int = 0  # run: the 1-based attempt that runs
    carried: dict[str, Any] = dataclasses.field(default_factory=dict)  # run: checkpoints
    retry_after: float | None = None  # in_flight
    parks: bool = False  # dead: this delivery turns a lapsed last claim into dead


class Model:
    """DESIGN §2 as a dict of key -> Row, on a clock that moves only when told to."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.rows: dict[str, Row] = {}
        self.runs: Counter[str] = Counter()  # handler runs the model allows, per key
        self.completions: Counter[tuple[str, int]] = Counter()
        self._tokens = itertools.count(1)
        self._generations = itertools.count(1)

    def current(self, key: str) -> Row | None:
        """The key's row, or None if absent or completed and past its expiry."""
        row = self.rows.get(key)
        if row is not None and row.state == COMPLETED:
            assert row.expires_at is not None
            if row.expires_at <= self.now:
                return None
        return row

    def predict(self, key: str, p: int) -> Prediction:
        """What delivering payload ``p`` of ``key`` now must answer."""
        row = self.current(key)
        if row is None:
            return Prediction("run", attempts=0, attempt=1)
        if row.payload != p:
            return Prediction("mismatch")
        if row.state == COMPLETED:
            return Prediction("replay")
        if row.state == DEAD:
            return Prediction("dead", attempts=row.attempts)
        if row.state == IN_PROGRESS:
            assert row.lease_until is not None
            if row.lease_until > self.now:
                return Prediction("in_flight", retry_after=row.lease_until - self.now)
            lapsed = row.attempts + 1  # the run that lost its lease counts as failed
            if lapsed >= MAX_ATTEMPTS:
                return Prediction("dead", attempts=lapsed, parks=True)
            return Prediction(
                "run", attempts=lapsed, attempt=lapsed + 1, carried=dict(row.checkpoint)
            )
        assert row.state == FAILED
        assert row.attempts < MAX_ATTEMPTS  # a failure reaching the limit is dead at once
        return Prediction(
            "run", attempts=row.attempts, attempt=row.attempts + 1, carried=dict(row.checkpoint)
        )

    def claim(self, key: str, p: int, pred: Prediction) -> int:
        """Take the claim a RUN prediction allows; returns the new model token."""
        row = self.current(key)
        generation = row.generation if row is not None else next(self._generations)
        token = next(self._tokens)
        # a retaken claim keeps the payload snapshot of the failed or lapsed run
        retaken = row is not None and row.state in (FAILED, IN_PROGRESS)
        self.rows[key] = Row(
            IN_PROGRESS,
            p,
            pred.attempts,
            token,
            generation,
            lease_until=self.now + LEASE,
            # a retake keeps the checkpoint the row holds when it is written, which a
            # lapsed holder may have saved after the read that predicted this run
            checkpoint=dict(row.checkpoint if retaken and row is not None else pred.carried),
            snapshot=row.snapshot if retaken and row is not None else None,
        )
        return token

    def park(self, key: str, pred: Prediction) -> None:
        """A lapsed last claim becomes dead under a new token (fencing the lapsed worker);
        the payload snapshot of an earlier failure is kept for redrive."""
        row = self.rows[key]
        row.state, row.attempts, row.lease_until = DEAD, pred.attempts, None
        row.token, row.error = next(self._tokens), "lease expired"

    def complete(self, key: str, token: int, result: Any, attempt: int) -> bool:
        """Complete the claim ``token`` if it is still the key's live claim."""
        row = self.rows.get(key)
        if row is None or row.state != IN_PROGRESS or row.token != token:
            return False
        row.state, row.result, row.attempt = COMPLETED, result, attempt
        row.lease_until, row.expires_at, row.checkpoint = None, self.now + TTL, {}
        self.completions[key, row.generation] += 1
        return True

    def fail(self, key: str, token: int, snapshot: Any) -> None:
        """The claim ``token`` failed: one more attempt; dead at the limit."""
        row = self.rows[key]
        assert row.state == IN_PROGRESS
        assert row.token == token
        row.attempts += 1
        row.state = DEAD if row.attempts >= MAX_ATTEMPTS else FAILED
        row.lease_until, row.snapshot, row.error = None, snapshot, "Boom"


# -- backends: a fresh store per example, and a way to move its clock


@dataclasses.dataclass
class Harness:
    store: Any
    start: float  # the model's now at the start
    advance: Callable[[float], None]
    close: Callable[[], None]
    exact: bool  # the model's times equal the store's (an injected clock)
    empty: Callable[[], None] | None = None  # delete every record (to reuse the store)


def memory_harness(tmp_path: Path) -> Harness:
    clock = ManualClock()
    return Harness(MemoryStore(clock=clock), clock(), clock.advance, lambda: None, True)


def sqlite_harness(tmp_path: Path) -> Harness:
    clock = ManualClock()
    table = f"m_{uuid.uuid4().hex[:12]}"
    store = SQLiteStore(str(tmp_path / "model.db"), table=table, clock=clock)
    store.migrate()

    def empty() -> None:
        with store.session() as s:
            s.execute(f"DELETE FROM {table}")

    return Harness(store, clock(), clock.advance, store.close, True, empty)


def postgres_harness(tmp_path: Path, *, partitioned: bool = False) -> Harness:
    """PostgreSQL's clock is the server's: move the stored times back instead.

    ``partitioned``: the time-partitioned table; its partition key ``created_at`` stays
    put (moving it would move rows between partitions, which nothing else ever does).
    """
    import psycopg

    table = f"m_{uuid.uuid4().hex[:12]}"
    store = onceonly.open_store(PG_URL, table=table)
    store.migrate(partitioned=partitioned)
    conn = psycopg.connect(PG_URL, autocommit=True)
    kinds = dict(
        conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s",
            (table,),
        ).fetchall()
    )
    shifts = []
    for col in ("lease_until", "expires_at", "created_at", "updated_at", "completed_at"):
        if col in kinds and not (partitioned and col == "created_at"):
            by = "make_interval(secs => %(s)s)" if "time" in kinds[col] else "%(s)s"
            shifts.append(f"{col} = {col} - {by}")

    def time_travel(seconds: float) -> None:
        conn.execute(f"UPDATE {table} SET {', '.join(shifts)}", {"s": seconds})

    def close() -> None:
        conn.close()
        store.close()
        drop_pg_table(table)

    def empty() -> None:
        conn.execute(f"DELETE FROM {table}")

    return Harness(store, 0.0, time_travel, close, False, empty)


def redis_harness(tmp_path: Path) -> Harness:
    """Redis's clock is the server's (``TIME`` in the scripts): move the stored times
    back, as for PostgreSQL. A record's own ``PEXPIREAT`` stays where it was (later than
    its shifted ``expires_at``), so an expired record is still there for the scripts to
    judge by ``expires_at``: the check the store must make itself."""
    import redis

    prefix = f"m_{uuid.uuid4().hex[:12]}:"
    store = onceonly.open_store(REDIS_URL, prefix=prefix)
    store.migrate()
    client = redis.Redis.from_url(REDIS_URL)
    times = ("lease_until", "expires_at", "created_at", "updated_at", "completed_at")

    def time_travel(seconds: float) -> None:
        by = round(seconds * 1_000_000)
        for k in client.scan_iter(match=f"{prefix}*"):
            values = client.hmget(k, times)
            shifted = {n: int(v) - by for n, v in zip(times, values, strict=True) if v is not None}
            if shifted:
                client.hset(k, mapping=shifted)

    def close() -> None:
        drop_redis_prefix(prefix)
        client.close()
        store.close()

    return Harness(store, 0.0, time_travel, close, False, lambda: drop_redis_prefix(prefix))


def mysql_harness(tmp_path: Path) -> Harness:
    """MariaDB/MySQL's clock is the server's: move the stored times back instead."""
    table = f"m_{uuid.uuid4().hex[:12]}"
    store = onceonly.open_store(MYSQL_URL, table=table, outbox_table=None)
    store.migrate()
    conn = _mysql_connect()
    shifts = ", ".join(
        f"{col} = {col} - %(s)s"
        for col in ("lease_until", "expires_at", "created_at", "updated_at", "completed_at")
    )

    def time_travel(seconds: float) -> None:
        conn.cursor().execute(f"UPDATE `{table}` SET {shifts}", {"s": seconds})

    def close() -> None:
        conn.close()
        store.close()
        drop_mysql_table(table)

    def empty() -> None:
        conn.cursor().execute(f"DELETE FROM `{table}`")

    return Harness(store, 0.0, time_travel, close, False, empty)


HARNESSES: dict[str, Callable[[Path], Harness]] = {
    "memory": memory_harness,
    "sqlite": sqlite_harness,
    "postgres": postgres_harness,
    "pgpart": functools.partial(postgres_harness, partitioned=True),
    "mysql": mysql_harness,
}
# The stores of leased mode: every store above, and Redis (which has no atomic mode).
LEASED_HARNESSES: dict[str, Callable[[Path], Harness]] = {**HARNESSES, "redis": redis_harness}


def check_record(key: str, row: Row | None, real: Record | None, *, exact: bool) -> None:
    """The stored record of ``key`` equals the model's row: state, fingerprint, attempts,
    result, checkpoint, error, payload snapshot and, on an exact clock, its times.

    Tokens are compared by each machine (the model names them by its own counter)."""
    if row is None:
        assert real is None, (key, real)
        return
    assert real is not None, key
    assert (real.scope, real.key) == (SCOPE, key)
    assert real.state.value == row.state, (key, real, row)
    assert real.fingerprint == fingerprint(payload_of(key, row.payload))
    assert real.attempts == row.attempts, (key, real, row)
    if row.state == COMPLETED:
        assert real.result is not None
        assert json.loads(real.result) == row.result
        assert real.error is None
        if exact:
            assert real.expires_at == row.expires_at
            assert row.expires_at is not None
            assert real.completed_at == row.expires_at - TTL
    elif row.state == IN_PROGRESS:
        if exact:
            assert real.lease_until == row.lease_until, (key, real, row)
        assert (json.loads(real.checkpoint) if real.checkpoint else {}) == row.checkpoint
    else:
        assert real.error is not None
        assert row.error is not None
        assert real.error.startswith(row.error), (real.error, row.error)
        if row.state == FAILED:
            got = json.loads(real.checkpoint) if real.checkpoint else {}
            assert got == row.checkpoint
        if row.snapshot is not None:
            assert real.payload is not None
            assert json.loads(real.payload) == row.snapshot
