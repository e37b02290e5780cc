# SPDX-License-Identifier: MIT
"""Cache tiers (local LRU → Redis → durable store): what they serve, what they never do."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly.stores.tiered import LocalTier, RedisTier, TieredStore
from tests.conftest import REDIS_URL, StoreFactory, business_table, require_redis

OPS = ("claim", "get", "update", "insert", "renew", "save_checkpoint")


class Counted:
    """A store whose session operations are counted (the durable store's round trips)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.ops: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def _wrap(self, session: Any) -> Any:
        counted = self

        class Session:
            def __getattr__(self, name: str) -> Any:
                attr = getattr(session, name)
                if name in OPS:

                    def op(*args: Any, **kwargs: Any) -> Any:
                        counted.ops[name] += 1
                        return attr(*args, **kwargs)

                    return op
                return attr

        return Session()

    def session(self) -> Any:
        from contextlib import contextmanager

        @contextmanager
        def cm() -> Iterator[Any]:
            self.ops["session()"] += 1
            with self.store.session() as s:
                yield self._wrap(s)

        return cm()

    def transaction(self, connection: Any = None, *, lock_wait: float = 5.0) -> Any:
        from contextlib import contextmanager

        @contextmanager
        def cm() -> Iterator[Any]:
            self.ops["transaction()"] += 1
            with self.store.transaction(connection, lock_wait=lock_wait) as s:
                yield self._wrap(s)

        return cm()


@pytest.fixture(params=["sqlite", "postgres"])
def durable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    factory = StoreFactory(request.param, tmp_path)
    store = factory()
    store.migrate()
    yield store
    factory.close()


@pytest.fixture
def redis_factory(tmp_path: Path) -> Iterator[StoreFactory]:
    factory = StoreFactory("redis", tmp_path)
    yield factory
    factory.close()


@pytest.fixture
def redis_tier(redis_factory: StoreFactory) -> Iterator[Callable[..., RedisTier]]:
    """Makes Redis tiers (on the given Redis store, else a new one) and closes them."""
    made: list[RedisTier] = []

    def make(store: Any = None, **options: Any) -> RedisTier:
        made.append(RedisTier(store if store is not None else redis_factory(), **options))
        return made[-1]

    yield make
    for tier in made:
        tier.close()


def charge_fn(store: Any, runs: list[str], ttl: float = 3600) -> Any:
    @onceonly.idempotent(store, key=lambda order, amount=1: order, scope="charge", ttl=ttl)
    def charge(order: str, amount: int = 1) -> str:
        runs.append(order)
        return f"charged {order} {amount}"

    return charge


def test_a_replay_from_the_local_tier_costs_no_round_trip(durable: Any) -> None:
    """New key: claim + completion in the durable store; replays: nothing."""
    counted = Counted(durable)
    store = TieredStore(counted, local=LocalTier(100, 60))
    runs: list[str] = []
    charge = charge_fn(store, runs)
    assert charge("o-1") == "charged o-1 1"
    assert counted.ops == Counter({"session()": 2, "claim": 1, "update": 1})
    counted.ops.clear()
    assert [charge("o-1") for _ in range(5)] == ["charged o-1 1"] * 5
    assert counted.ops == Counter() and store.hits["local"] == 5
    assert runs == ["o-1"]


def test_other_processes_replay_from_the_redis_tier(
    durable: Any, redis_factory: StoreFactory, redis_tier: Callable[..., RedisTier]
) -> None:
    """A completion is written to Redis; another process's first replay costs one GET and
    no durable round trip (once it read the durable store's id: one read per process),
    its next ones nothing."""
    redis_store = redis_factory()
    a_counted, b_counted = Counted(durable), Counted(durable)
    a = TieredStore(a_counted, local=LocalTier(), redis=redis_tier(redis_store))
    b = TieredStore(b_counted, local=LocalTier(), redis=redis_tier(redis_store))
    runs: list[str] = []
    assert charge_fn(a, runs)("o-1") == "charged o-1 1"
    assert b.store_id() == a.store_id()
    assert b_counted.ops == Counter({"session()": 1, "get": 1})  # the id, once
    b_counted.ops.clear()
    b_charge = charge_fn(b, runs)
    assert b_charge("o-1") == b_charge("o-1") == "charged o-1 1"
    assert runs == ["o-1"]
    assert b_counted.ops == Counter()
    assert (b.hits["redis"], b.hits["local"]) == (1, 1)


def test_inbox_stays_atomic_and_replays_from_the_tier(durable: Any) -> None:
    """The inbox claims in the durable store's transaction (the business row commits with
    it); a duplicate replays from the tier without opening one; a rolled-back run caches
    nothing."""
    count = business_table(durable)
    counted = Counted(durable)
    store = TieredStore(counted, local=LocalTier())
    inbox = onceonly.Inbox(store, consumer="billing")
    ledger = f"{durable.table}_ledger"

    def handler(msg: dict[str, Any], tx: Any) -> str:
        tx.execute(f"INSERT INTO {ledger} (id, amount) VALUES (?, ?)", (msg["id"], 1))
        if msg.get("boom"):
            raise RuntimeError("boom")
        return "ok"

    assert inbox.process("m-1", {"id": "m-1"}, handler).replayed is False
    counted.ops.clear()
    assert inbox.process("m-1", {"id": "m-1"}, handler).replayed is True
    assert counted.ops == Counter()  # no transaction, no connection
    assert store.hits["local"] == 1 and count() == 1
    with pytest.raises(RuntimeError):
        inbox.process("m-2", {"id": "m-2", "boom": True}, handler)
    assert store.local is not None and store.local.get("billing", "m-2") is None  # failed
    with pytest.raises(RuntimeError):
        inbox.process("m-2", {"id": "m-2", "boom": True}, handler)  # ran again
    assert count() == 1


def test_a_live_claim_is_never_cached(durable: Any) -> None:
    """While the first call runs, a duplicate is in flight: the claim was not cached."""
    store = TieredStore(durable, local=LocalTier())
    started, release = threading.Event(), threading.Event()

    @onceonly.idempotent(store, key=lambda: "k", scope="slow", lease=5, wait=0.1)
    def slow() -> str:
        started.set()
        release.wait(5)
        return "done"

    t = threading.Thread(target=slow)
    t.start()
    assert started.wait(5)
    with pytest.raises(onceonly.InFlight):
        slow()
    release.set()
    t.join(5)
    assert slow() == "done" and store.hits["local"] == 1


def test_expiry_and_fingerprint_are_checked_on_every_cached_read(durable: Any) -> None:
    """A cached record past its expiry runs again; other arguments are a mismatch decided
    by the durable store, never by the tier."""
    store = TieredStore(durable, local=LocalTier(100, 600))
    runs: list[str] = []
    charge = charge_fn(store, runs, ttl=0.5)
    charge("o-1")
    with pytest.raises(onceonly.PayloadMismatch):
        charge("o-1", 2)
    assert store.hits["local"] == 0  # the cached record had another fingerprint
    time.sleep(0.6)
    assert charge("o-1") == "charged o-1 1" and runs == ["o-1", "o-1"]


def test_operator_delete_clears_the_tiers(
    durable: Any, redis_tier: Callable[..., RedisTier]
) -> None:
    """A delete through the tiered store's admin is forgotten by both tiers at once."""
    store = TieredStore(durable, local=LocalTier(), redis=redis_tier())
    runs: list[str] = []
    charge = charge_fn(store, runs)
    charge("o-1")
    assert onceonly.Admin(store).delete("charge", "o-1")
    charge("o-1")
    assert runs == ["o-1", "o-1"]


def test_a_delete_the_tier_does_not_hear_of_is_stale_for_at_most_the_tier_ttl(
    durable: Any,
) -> None:
    """Deleted behind the tier's back (another process, the CLI): replays from the local
    tier until its ttl, then the durable store answers."""
    store = TieredStore(durable, local=LocalTier(100, 0.5))
    runs: list[str] = []
    charge = charge_fn(store, runs)
    charge("o-1")
    assert onceonly.Admin(durable).delete("charge", "o-1")
    charge("o-1")
    assert runs == ["o-1"]  # stale: served by the local tier
    time.sleep(0.6)
    charge("o-1")
    assert runs == ["o-1", "o-1"]


def test_a_failing_redis_tier_is_skipped(durable: Any, tmp_path: Path) -> None:
    """Redis unreachable: calls are served by the durable store, nothing raises."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = onceonly.open_store(f"redis://127.0.0.1:{port}/0", socket_timeout=0.5)
    try:
        tier = RedisTier(dead)
        store = TieredStore(durable, redis=tier)
        runs: list[str] = []
        charge = charge_fn(store, runs)
        assert charge("o-1") == charge("o-1") == "charged o-1 1"
        assert runs == ["o-1"] and store.hits["durable"] == 2
    finally:
        tier.close()
        dead.close()


def test_tiers_are_checked_up_front(durable: Any) -> None:
    """No tier, or a tier with a bad size or ttl, is a ConfigurationError."""
    with pytest.raises(onceonly.ConfigurationError):
        TieredStore(durable)
    with pytest.raises(onceonly.ConfigurationError):
        LocalTier(0)
    with pytest.raises(onceonly.ConfigurationError):
        LocalTier(10, 0)


def test_the_lru_keeps_the_most_recently_used() -> None:
    """Past its size the local tier forgets the least recently used record."""
    from onceonly._core.state import Record, State

    tier = LocalTier(2, 60)

    def rec(key: str) -> Record:
        return Record("s", key, State.COMPLETED, None, 1, 0, result="1")

    tier.put(rec("a"))
    tier.put(rec("b"))
    assert tier.get("s", "a") is not None
    tier.put(rec("c"))
    assert [k for k in "abc" if tier.get("s", k) is not None] == ["a", "c"]
    tier.put(Record("s", "d", State.IN_PROGRESS, None, 1, 0))
    assert tier.get("s", "d") is None


async def test_async_tiers(redis_factory: StoreFactory, tmp_path: Path) -> None:
    """The async store: a replay from the Redis tier, then from the local one."""
    from onceonly.stores.tiered import AsyncRedisTier, AsyncTieredStore

    require_redis()
    durable = onceonly.open_async_store(f"sqlite:///{tmp_path / 'a.db'}")
    await durable.migrate()
    aredis = onceonly.open_async_store(REDIS_URL, prefix=redis_factory.table)
    a_tier, b_tier = AsyncRedisTier(aredis), AsyncRedisTier(aredis)
    a = AsyncTieredStore(durable, local=LocalTier(), redis=a_tier)
    b = AsyncTieredStore(durable, local=LocalTier(), redis=b_tier)
    runs: list[int] = []

    def fn(store: Any) -> Any:
        @onceonly.idempotent(store, key=lambda n: str(n), scope="fn")
        async def f(n: int) -> int:
            runs.append(n)
            return n

        return f

    try:
        assert await fn(a)(1) == 1
        fb = fn(b)
        assert [await fb(1), await fb(1)] == [1, 1]
        assert runs == [1] and (b.hits["redis"], b.hits["local"], b.hits["durable"]) == (1, 1, 0)
    finally:
        await a_tier.close()
        await b_tier.close()
        await aredis.close()
        await durable.close()


def test_a_callers_rolled_back_transaction_is_never_cached(tmp_path: Path) -> None:
    """Inside the caller's own transaction the tiers cache nothing: its rollback undoes
    the claim, and the next delivery runs again instead of replaying from a tier."""
    import sqlite3

    path = tmp_path / "join.db"
    durable = onceonly.open_store(f"sqlite:///{path}")
    durable.migrate()
    store = TieredStore(durable, local=LocalTier())
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        inbox = onceonly.Inbox(store, consumer="c")
        conn.execute("BEGIN")
        assert inbox.process("k", {}, lambda p, tx: 1, connection=conn).result == 1
        conn.execute("ROLLBACK")
        assert inbox.process("k", {}, lambda p, tx: 2).result == 2
        assert inbox.process("k", {}, lambda p, tx: 3).result == 2  # replayed, committed
    finally:
        conn.close()
        durable.close()


def test_a_completion_whose_commit_fails_is_never_cached(
    pg_store_factory: StoreFactory,
) -> None:
    """The inbox's completion is cached only once its transaction has committed: a
    deferred constraint that fails the COMMIT leaves nothing to replay."""
    durable = pg_store_factory()
    durable.migrate()
    table = f"{durable.table}_deferred"
    with durable.transaction() as s:
        s.execute(
            f"CREATE TABLE {table} (id TEXT, CONSTRAINT {table}_u UNIQUE (id)"
            " DEFERRABLE INITIALLY DEFERRED)"
        )
    store = TieredStore(durable, local=LocalTier())
    inbox = onceonly.Inbox(store, consumer="c", max_attempts=5)
    runs: list[int] = []

    def handler(msg: Any, tx: Any) -> str:
        runs.append(1)
        tx.execute(f"INSERT INTO {table} (id) VALUES (?), (?)", ("x", "x"))  # at COMMIT
        return "done"

    try:
        for _ in range(2):
            with pytest.raises(onceonly.OnceOnlyError):
                inbox.process("k", {}, handler)
        assert len(runs) == 2 and store.hits["local"] == 0
    finally:
        with durable.transaction() as s:
            s.execute(f"DROP TABLE {table}")
