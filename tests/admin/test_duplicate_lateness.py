# SPDX-License-Identifier: MIT
"""Duplicate lateness end to end (spec §8.4): replays carry how late they came (store
clock), a DuplicateRecorder writes them per scope, minute and bin, and
Admin.duplicate_lateness reads the histogram and the rate back; on SQLite with a manual
clock, on PostgreSQL with real waits, and the table's upsert on every store."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly._core.admin import BUCKET_SECONDS
from onceonly._core.lateness import HALF_TTL, NEAR_TTL, RAN
from onceonly.admin import DuplicateRecorder
from onceonly.events import Event, EventKind
from onceonly.stores.sqlite import SQLiteStore
from onceonly.testing import ManualClock
from tests.conftest import PG_URL, drop_pg_table, require_postgres, unique_table

HOUR = 3600.0


def test_replays_carry_lateness_and_land_in_their_bins_sqlite(tmp_path: Path) -> None:
    """Atomic inbox, leased inbox and @idempotent on SQLite with a manual clock: each
    replay's lateness (clock moved by the test) lands in its bin; the run after the
    ttl is counted as a run; the report's rate and ttl match."""
    clock = ManualClock()
    store = SQLiteStore(str(tmp_path / "late.db"), clock=clock)
    store.migrate()
    seen: list[Event] = []
    recorder = DuplicateRecorder(store, background=False)
    listeners = [recorder, seen.append]
    atomic = onceonly.Inbox(store, consumer="atomic", ttl=timedelta(hours=1), listeners=listeners)
    leased = onceonly.Inbox(
        store, consumer="leased", ttl=timedelta(hours=1), mode="leased", listeners=listeners
    )

    @onceonly.idempotent(store, key=lambda n: str(n), scope="fn", ttl=timedelta(hours=1),
                         listeners=listeners)  # fmt: skip
    def fn(n: int) -> int:
        return n * 2

    def deliver_all() -> None:
        atomic.process("m1", {"n": 1}, lambda p, tx: "ok")
        leased.process("m1", {"n": 1}, lambda p, tx: "ok")
        fn(1)

    deliver_all()  # three runs
    for step in (0.5, 30 - 0.5, 1800 - 30, 3300 - 1800):  # at 0.5 s, 30 s, 30 min, 55 min
        clock.advance(step)
        deliver_all()
    clock.advance(600)  # 65 min: past the ttl, each runs again
    deliver_all()

    replays = [e for e in seen if e.kind is EventKind.REPLAYED]
    assert [e.lateness for e in replays if e.scope == "atomic"] == [0.5, 30.0, 1800.0, 3300.0]
    assert {e.ttl for e in replays} == {HOUR}
    assert all(e.lateness is None for e in seen if e.kind is EventKind.COMPLETED)

    assert recorder.flush() > 0
    report = onceonly.Admin(store).duplicate_lateness(window=600, points=1)
    for scope in ("atomic", "leased", "fn"):
        bins = report.by_scope[scope]
        assert (bins[1], bins[3], bins[HALF_TTL], bins[NEAR_TTL]) == (1, 1, 1, 1), scope
        assert sum(bins.values()) == 4
        assert report.ttl[scope] == HOUR
        assert report.points[-1].counts[scope] == (6, 4)  # 2 runs + 4 duplicates
    assert report.bins[1] == 3 and report.bins[NEAR_TTL] == 3 and report.duplicates == 12
    only = onceonly.Admin(store).duplicate_lateness(window=600, points=1, scope="fn")
    assert set(only.by_scope) == {"fn"} and only.duplicates == 4
    store.close()


def test_replays_at_real_lateness_on_postgres() -> None:
    """PostgreSQL's own clock: duplicates after about 0 s, 1.2 s, 2.2 s and 3.8 s of a
    4 s ttl land in < 1 s, < 10 s, >= half the ttl and >= 90 % of it."""
    require_postgres()
    table = unique_table()
    store = onceonly.open_store(PG_URL, table=table, outbox_table=f"{table}_outbox")
    try:
        store.migrate()
        recorder = DuplicateRecorder(store, background=False)
        inbox = onceonly.Inbox(store, consumer="pg", ttl=timedelta(seconds=4), listeners=[recorder])
        inbox.process("m", {"n": 1}, lambda p, tx: 1)
        start = time.monotonic()
        for at in (0.0, 1.2, 2.2, 3.8):
            time.sleep(max(0.0, at - (time.monotonic() - start)))
            assert inbox.process("m", {"n": 1}, lambda p, tx: 2).replayed
        assert recorder.flush() > 0
        report = onceonly.Admin(store).duplicate_lateness(window=600, points=2)
        bins = report.by_scope["pg"]
        assert (bins[1], bins[2], bins[HALF_TTL], bins[NEAR_TTL]) == (1, 1, 1, 1)
        assert report.ttl["pg"] == pytest.approx(4.0, abs=0.01)
        assert sum(c for p in report.points for c, _ in p.counts.values()) == 5
    finally:
        store.close()
        drop_pg_table(table)
        drop_pg_table(f"{table}_outbox")
        drop_pg_table(f"{table}_lateness")


async def test_lateness_table_upsert_adds_and_keeps_the_largest_ttl(async_store: Any) -> None:
    """Every store: rows add up per (scope, minute, bin), the ttl is the largest seen,
    reads group by interval; nothing recorded reads as empty."""
    admin = onceonly.AsyncAdmin(async_store)
    assert await admin.records.read_lateness(0, 60) == []
    assert not (await admin.duplicate_lateness()).recorded
    now = int(time.time()) // BUCKET_SECONDS * BUCKET_SECONDS
    await admin.records.add_lateness(
        [("a", now, RAN, 5, None), ("a", now, 3, 2, 60.0), ("a", now - 60, 3, 1, None)]
    )
    await admin.records.add_lateness([("a", now, 3, 4, 30.0), ("a", now, RAN, 1, None)])
    rows = await admin.records.read_lateness(now, 60)
    assert rows == [("a", now, RAN, 6, None), ("a", now, 3, 6, 60.0)]
    wide = await admin.records.read_lateness(now - 60, 3600)
    assert [r[2:] for r in wide] == [(RAN, 6, None), (3, 7, 60.0)]
    report = await admin.duplicate_lateness(window=3600, points=6)
    assert report.bins[3] == 7
    # points are 600 s spans from multiples of 600 s: `now - 60` lies in the point
    # before `now`'s when `now` is in the first minute of its span
    counts = {int(p.start): p.counts.get("a", (0, 0)) for p in report.points}
    span, before = now // 600 * 600, (now - 60) // 600 * 600
    if span == before:
        assert counts[span] == (13, 7)
    else:
        assert (counts[before], counts[span]) == ((1, 1), (12, 6))
    assert sum(c for c, _ in counts.values()) == 13
