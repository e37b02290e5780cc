# SPDX-License-Identifier: MIT
"""onceonly.admin on every store (spec §8): purge, reap, list, show, redrive, delete, stats."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from onceonly._core.admin import Query
from onceonly._core.state import Expect, State
from onceonly.admin import Admin
from tests.admin._records import keys, put
from tests.conftest import drop_pg_table


def _seed(store: Any) -> None:
    put(store, "s", "expired-1", State.COMPLETED, ttl=-60)
    put(store, "s", "expired-2", State.COMPLETED, ttl=-60)
    put(store, "t", "expired-3", State.COMPLETED, ttl=-5)
    put(store, "s", "live", State.COMPLETED, ttl=3600)
    put(store, "s", "forever", State.COMPLETED)
    put(store, "s", "running", State.IN_PROGRESS, lease=3600)
    put(store, "s", "lapsed", State.IN_PROGRESS, lease=-60)
    put(store, "s", "failed", State.FAILED, attempts=1, error="boom", payload='{"a":1}')
    put(store, "s", "dead", State.DEAD, attempts=5, error="boom", payload='{"a":1}')


def test_purge_deletes_only_expired_completed(store: Any) -> None:
    """Expired completed records go; live, in-progress, failed and dead ones stay."""
    _seed(store)
    admin = Admin(store)
    assert admin.purge(dry_run=True).deleted == 3
    assert len(keys(store)) == 9  # a dry run deletes nothing
    report = admin.purge(batch_size=2, pause=0)
    assert (report.deleted, report.batches) == (3, 2)
    assert keys(store) == {
        ("s", k) for k in ("live", "forever", "running", "lapsed", "failed", "dead")
    }


def test_purge_older_than_scope_and_include_dead(store: Any) -> None:
    """older_than keeps recent expiries; scope limits; include_dead takes failed/dead."""
    _seed(store)
    admin = Admin(store)
    assert admin.purge(older_than=30, pause=0).deleted == 2  # expired-3 expired 5 s ago
    assert ("t", "expired-3") in keys(store)
    assert admin.purge(scope="s", pause=0).deleted == 0
    assert admin.purge(scope="t", pause=0).deleted == 1
    assert admin.purge(include_dead=True, older_than=3600, pause=0).deleted == 0
    assert admin.purge(include_dead=True, pause=0).deleted == 2
    assert keys(store) == {("s", k) for k in ("live", "forever", "running", "lapsed")}


def test_reap_moves_lapsed_claims_to_failed(store: Any) -> None:
    """A lapsed claim becomes failed with the lapsed run counted and a new token."""
    _seed(store)
    before = Admin(store).show("s", "lapsed")
    assert before is not None
    report = Admin(store).reap(pause=0)
    assert (report.reaped, report.skipped) == (1, 0)
    after = Admin(store).show("s", "lapsed")
    assert after is not None and after.state is State.FAILED
    assert after.attempts == before.attempts + 1 and after.token != before.token
    assert after.error and "lease expired" in after.error
    running = Admin(store).show("s", "running")
    assert running is not None and running.state is State.IN_PROGRESS
    with store.session() as s:  # the lapsed worker can no longer complete its claim
        assert s.update("s", "lapsed", Expect.holder(before.token), _done(before)) is None
    assert Admin(store).reap(pause=0).reaped == 0


def _done(record: Any) -> Any:
    from onceonly._core.state import complete_write

    return complete_write(record, '"late"', 60)


class _Interleave:
    """An admin side whose scan lets another actor act between the read and the write."""

    def __init__(self, inner: Any, act: Any) -> None:
        self.inner = inner
        self.act = act

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def scan(self, query: Query) -> Any:
        out = self.inner.scan(query)
        self.act()
        return out


@pytest.mark.parametrize("worker", ["renews", "completes"])
def test_reap_loses_to_a_worker_acting_after_its_read(store: Any, worker: str) -> None:
    """A worker that renews or completes between the reaper's read and its write wins."""
    held = put(store, "s", "k", State.IN_PROGRESS, lease=-1)

    def act() -> None:
        with store.session() as s:
            if worker == "renews":
                assert s.renew("s", "k", held.token, 60) is not None
            else:
                assert s.update("s", "k", Expect.holder(held.token), _done(held)) is not None

    admin = Admin(store)
    admin.records = _Interleave(admin.records, act)  # type: ignore[assignment]
    report = admin.reap(pause=0)
    assert (report.reaped, report.skipped) == (0, 1)
    record = Admin(store).show("s", "k")
    assert record is not None and record.token == held.token
    assert record.state is (State.IN_PROGRESS if worker == "renews" else State.COMPLETED)


def test_redrive_dead_and_failed(store: Any) -> None:
    """Redrive: failed, zero attempts, new token, error and payload kept; only dead/failed."""
    _seed(store)
    admin = Admin(store)
    dead = admin.show("s", "dead")
    assert dead is not None
    redriven = admin.redrive("s", "dead")
    assert redriven is not None and redriven.state is State.FAILED
    assert redriven.attempts == 0 and redriven.token != dead.token
    assert redriven.payload == '{"a":1}' and redriven.error == "boom"
    assert admin.redrive("s", "live") is None
    assert admin.redrive("s", "running") is None
    assert admin.redrive("s", "absent") is None
    assert admin.redrive_all(state=State.FAILED, scope="s") == 2  # failed + the redriven
    assert admin.redrive_all() == 0


def test_redrive_loses_to_a_concurrent_writer(store: Any) -> None:
    """A redrive decided from a version another writer changed meanwhile writes nothing."""
    put(store, "s", "k", State.DEAD, attempts=5)
    first, second = Admin(store), Admin(store)
    seen = first.show("s", "k")
    assert second.redrive("s", "k") is not None  # acts between first's read and write

    class Stale(Admin):
        def show(self, scope: str, key: str) -> Any:
            return seen

    assert Stale(store).redrive("s", "k") is None
    assert Stale(store).delete("s", "k") is False
    record = Admin(store).show("s", "k")
    assert record is not None and record.state is State.FAILED


def test_delete_and_list(store: Any) -> None:
    """list filters by state, scope and age and pages by (scope, key); delete removes one."""
    _seed(store)
    admin = Admin(store)
    assert [r.key for r in admin.list_records(state=State.COMPLETED, scope="s")] == [
        "expired-1",
        "expired-2",
        "forever",
        "live",
    ]
    page = admin.list_records(limit=3)
    rest = admin.list_records(limit=100, after=(page[-1].scope, page[-1].key))
    assert len(page) + len(rest) == 9
    assert admin.list_records(older_than=3600) == []
    assert admin.delete("s", "running") is True
    assert admin.delete("s", "running") is False
    assert admin.show("s", "running") is None


def test_stats(store: Any) -> None:
    """Counts by state, oldest in-progress age and expired rows, per scope."""
    _seed(store)
    report = Admin(store).stats()
    by = {s.scope: s for s in report.scopes}
    assert set(by) == {"s", "t"}
    s = by["s"]
    assert s.counts[State.COMPLETED] == 4 and s.counts[State.IN_PROGRESS] == 2
    assert s.counts[State.FAILED] == 1 and s.counts[State.DEAD] == 1 and s.total == 8
    assert s.expired == 2 and by["t"].expired == 1
    assert s.oldest_in_progress is not None and 0 <= s.oldest_in_progress < 60
    assert by["t"].oldest_in_progress is None
    assert [x.scope for x in Admin(store).stats(scope="t").scopes] == ["t"]


@pytest.fixture
def counted_store(store: Any) -> Iterator[Any]:
    yield store
    if getattr(store, "dialect", None) == "postgresql":
        drop_pg_table(f"{store.table}_counts")


def test_duplicate_rate_from_flushed_counters(counted_store: Any) -> None:
    """A DuplicateCounter writes nothing per delivery; after a flush stats show the rate."""
    import onceonly
    from onceonly.admin import DuplicateCounter

    store = counted_store
    counter = DuplicateCounter(store, flush_seconds=3600)
    inbox = onceonly.Inbox(store, consumer="pay", listeners=[counter])
    for key in ("a", "b", "c", "a", "b"):
        inbox.process(key, {"k": key}, lambda m, tx: 1)
    assert Admin(store).stats(scope="pay").scopes[0].claims == 0  # nothing written yet
    counter.flush()
    counter.flush()  # nothing more to add
    pay = Admin(store).stats(scope="pay").scopes[0]
    assert (pay.claims, pay.replays, pay.duplicate_rate) == (5, 2, 0.4)
    eager = DuplicateCounter(store, flush_seconds=0)  # due on every delivery
    eager_inbox = onceonly.Inbox(store, consumer="mail", listeners=[eager])
    eager_inbox.process("m", 1, lambda m, tx: 1)
    eager_inbox.process("m", 1, lambda m, tx: 1)
    mail = next(s for s in Admin(store).stats().scopes if s.scope == "mail")
    assert (mail.claims, mail.replays) == (2, 1)


def test_two_reapers_at_once_count_each_lapse_once(store: Any) -> None:
    """Two reapers racing over the same lapsed claims reap each exactly once (attempts +1)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    for i in range(60):
        put(store, "s", f"k{i:02}", State.IN_PROGRESS, lease=-1, attempts=2)
    barrier = threading.Barrier(2)

    def reap() -> Any:
        barrier.wait()
        return Admin(store).reap(batch_size=7, pause=0)

    with ThreadPoolExecutor(2) as pool:
        reports = [f.result(timeout=60) for f in [pool.submit(reap), pool.submit(reap)]]
    assert sum(r.reaped for r in reports) == 60
    records = Admin(store).list_records(limit=100)
    assert {(r.state, r.attempts) for r in records} == {(State.FAILED, 3)}


def test_stats_creates_nothing(sql_store: Any) -> None:
    """Reading stats before any counter flush creates no counters table (read-only users)."""
    Admin(sql_store).stats()
    name = f"{sql_store.table}_counts"
    if sql_store.dialect == "sqlite":
        query = "SELECT count(*) FROM sqlite_master WHERE name = ?"
    elif sql_store.dialect == "mysql":
        query = "SELECT count(*) FROM information_schema.tables WHERE table_name = ?"
    else:
        query = "SELECT count(*) FROM pg_class WHERE relname = ?"
    with sql_store.session() as s:
        assert s.execute(query, (name,)).fetchone()[0] == 0
