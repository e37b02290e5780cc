# SPDX-License-Identifier: MIT
"""Cache tiers at their edges (docs/stores.md, "Cache tiers"): two durable stores on one
Redis prefix, an operator's delete racing a tier fill, a Redis tier that stops answering,
and a batch through a tiered store."""

from __future__ import annotations

import os
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly.admin import admin_store
from onceonly.stores.tiered import LocalTier, RedisTier, TieredStore
from onceonly.stores.tiered._tiers import CircuitBreaker
from tests.conftest import StoreFactory
from tests.outbox.test_relay_outage import Server, _free_port, _need


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


def charge_fn(store: Any, runs: list[str]) -> Any:
    @onceonly.idempotent(store, key=lambda order: order, scope="charge", ttl=3600)
    def charge(order: str) -> str:
        runs.append(order)
        return f"charged {order}"

    return charge


# -- (a) the tier keys name the durable store


def test_two_durable_stores_on_one_redis_prefix_never_answer_each_other(
    tmp_path: Path, redis_factory: StoreFactory, redis_tier: Callable[..., RedisTier]
) -> None:
    """Two PostgreSQL tables, one Redis prefix, one consumer name: each inbox runs its own
    handler once and replays its own result, never the other store's."""
    shipping_db, billing_db = StoreFactory("postgres", tmp_path), StoreFactory("postgres", tmp_path)
    try:
        cache = redis_factory()
        stores = {}
        for name, factory in (("shipping", shipping_db), ("billing", billing_db)):
            durable = factory()
            durable.migrate()
            stores[name] = TieredStore(durable, redis=redis_tier(cache))
        runs: list[str] = []

        def handler(name: str) -> Any:
            def run(msg: Any, tx: Any) -> str:
                runs.append(name)
                return {"shipping": "order shipped", "billing": "order charged"}[name]

            return run

        inboxes = {n: onceonly.Inbox(s, consumer="orders") for n, s in stores.items()}
        first = {n: inboxes[n].process("m-1", {"order": 7}, handler(n)) for n in inboxes}
        assert first["billing"].replayed is False
        assert first["billing"].result == "order charged"
        assert sorted(runs) == ["billing", "shipping"]
        again = {n: inboxes[n].process("m-1", {"order": 7}, handler(n)) for n in inboxes}
        assert again["shipping"].result == "order shipped" and again["shipping"].replayed
        assert again["billing"].result == "order charged" and again["billing"].replayed
        assert stores["billing"].hits["redis"] == 1 and stores["shipping"].hits["redis"] == 1
        assert sorted(runs) == ["billing", "shipping"]
    finally:
        shipping_db.close()
        billing_db.close()


def test_a_local_tier_serves_one_durable_store() -> None:
    """A LocalTier given to tiered stores over two durable stores is refused."""
    local = LocalTier()
    a, b = onceonly.open_store("memory://"), onceonly.open_store("memory://")
    TieredStore(a, local=local)
    TieredStore(a, local=local)  # the same durable store again: fine
    with pytest.raises(onceonly.ConfigurationError):
        TieredStore(b, local=local)


# -- (b) an operator's delete against a concurrent tier fill


class Stop:
    """Where one thread stops until the test releases it."""

    def __init__(self, who: threading.Thread) -> None:
        self.who = who
        self.reached, self.release = threading.Event(), threading.Event()


class Paused:
    """The durable store, whose threads stop at chosen points until released: after a
    session operation (its name) or a commit (``"commit"``), the moment between the
    durable store's answer and the tier fill that follows it; or before an operator's
    delete reaches the durable store (``"delete"``)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.stops: dict[str, Stop] = {}

    def stop(self, point: str, who: threading.Thread) -> Stop:
        self.stops[point] = Stop(who)
        return self.stops[point]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def admin(self) -> Any:
        inner, paused = admin_store(self.store), self

        class Admin:
            def __getattr__(self, name: str) -> Any:
                return getattr(inner, name)

            def delete(self, *args: Any) -> bool:
                paused._stop_here("delete")
                return bool(inner.delete(*args))

        return Admin()

    def _stop_here(self, point: str) -> None:
        stop = self.stops.get(point)
        if stop is not None and threading.current_thread() is stop.who:
            del self.stops[point]
            stop.reached.set()
            assert stop.release.wait(20)

    def _wrap(self, session: Any) -> Any:
        paused = self

        class Session:
            def __getattr__(self, name: str) -> Any:
                attr = getattr(session, name)
                if not callable(attr):
                    return attr

                def op(*args: Any, **kwargs: Any) -> Any:
                    result = attr(*args, **kwargs)
                    paused._stop_here(name)
                    return result

                return op

            @property
            def connection(self) -> Any:
                return session.connection

        return Session()

    def session(self) -> Any:
        @contextmanager
        def cm() -> Iterator[Any]:
            with self.store.session() as s:
                yield self._wrap(s)

        return cm()

    def transaction(self, connection: Any = None, *, lock_wait: float = 5.0) -> Any:
        @contextmanager
        def cm() -> Iterator[Any]:
            with self.store.transaction(connection, lock_wait=lock_wait) as s:
                yield self._wrap(s)
            self._stop_here("commit")  # committed; the tier fill comes next

        return cm()


def _tiers(which: str, redis_tier: Callable[..., RedisTier]) -> dict[str, Any]:
    if which == "local":
        return {"local": LocalTier()}
    return {"redis": redis_tier()}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tier", ["local", "redis"])
@pytest.mark.parametrize("path", ["replay-read", "leased-completion", "atomic-completion"])
def test_an_operator_delete_wins_over_a_concurrent_tier_fill(
    durable: Any, redis_tier: Callable[..., RedisTier], tier: str, path: str
) -> None:
    """The fill of a record the durable store answered is held until the record was
    deleted (and the tiers told); the next delivery runs the handler again."""
    paused = Paused(durable)
    store = TieredStore(paused, **_tiers(tier, redis_tier))
    runs: list[str] = []
    charge = charge_fn(store, runs)
    inbox = onceonly.Inbox(store, consumer="c")

    def deliver() -> Any:
        if path == "atomic-completion":
            return inbox.process("o-1", {}, lambda msg, tx: runs.append("o-1") or "done")
        return charge("o-1")

    scope = "c" if path == "atomic-completion" else "charge"
    worker = threading.Thread(target=deliver)
    if path == "replay-read":
        charge_fn(durable, runs)("o-1")  # completed in the durable store, in no tier
        stop = paused.stop("claim", worker)  # the duplicate's claim reads it; its fill waits
    else:
        stop = paused.stop("commit" if path == "atomic-completion" else "update", worker)
    worker.start()
    assert stop.reached.wait(20)
    assert onceonly.Admin(store).delete(scope, "o-1")
    stop.release.set()
    worker.join(20)
    assert runs == ["o-1"]
    deliver()
    assert runs == ["o-1", "o-1"], "the deleted record replayed from a tier"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tier", ["local", "redis"])
def test_a_fill_read_between_the_delete_and_its_invalidations_is_dropped(
    durable: Any, redis_tier: Callable[..., RedisTier], tier: str
) -> None:
    """A duplicate that looks in the tiers after the delete told them once, and reads
    the record before the durable delete: its fill comes after the delete and is dropped."""
    paused = Paused(durable)
    store = TieredStore(paused, **_tiers(tier, redis_tier))
    runs: list[str] = []
    charge_fn(durable, runs)("o-1")
    deleted: list[bool] = []
    operator = threading.Thread(
        target=lambda: deleted.append(onceonly.Admin(store).delete("charge", "o-1"))
    )
    worker = threading.Thread(target=charge_fn(store, runs), args=("o-1",))
    before_delete = paused.stop("delete", operator)
    read = paused.stop("claim", worker)
    operator.start()
    assert before_delete.reached.wait(20)  # the tiers were told; the record is still there
    worker.start()
    assert read.reached.wait(20)  # the duplicate read it (a replay); its fill waits
    before_delete.release.set()
    operator.join(20)
    assert deleted == [True]
    read.release.set()
    worker.join(20)
    assert runs == ["o-1"]
    charge_fn(store, runs)("o-1")
    assert runs == ["o-1", "o-1"], "the deleted record replayed from a tier"


def test_a_redriven_record_runs_again(durable: Any, redis_tier: Callable[..., RedisTier]) -> None:
    """A dead record redriven through Admin(tiered_store) runs again on its next
    delivery (no tier holds a dead record)."""
    store = TieredStore(durable, local=LocalTier(), redis=redis_tier())
    inbox = onceonly.Inbox(store, consumer="c", max_attempts=1)
    runs: list[str] = []

    def boom(msg: Any, tx: Any) -> str:
        runs.append("boom")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        inbox.process("k", {}, boom)
    assert onceonly.Admin(store).redrive("c", "k") is not None
    assert inbox.process("k", {}, lambda msg, tx: runs.append("ok") or "ok").result == "ok"
    assert runs == ["boom", "ok"]


# -- (c) a Redis tier that stops answering


def test_the_breaker_opens_after_failures_and_probes_after_the_cool_down() -> None:
    """Closed → open after N failures in a row → one probe after the cool-down → closed
    on success, open again on failure."""
    now = [0.0]
    breaker = CircuitBreaker(failures=3, cooldown=5.0, clock=lambda: now[0])
    for _ in range(2):
        assert breaker.allow()
        breaker.failure()
    assert breaker.allow()
    breaker.success()  # a success resets the count
    for _ in range(3):
        assert breaker.allow()
        breaker.failure()
    assert breaker.state == "open" and not breaker.allow()
    now[0] = 5.1
    assert breaker.allow() and breaker.state == "half-open"
    assert not breaker.allow()  # one probe at a time
    breaker.failure()
    assert breaker.state == "open" and not breaker.allow()
    now[0] = 10.2
    assert breaker.allow()
    breaker.success()
    assert breaker.state == "closed" and breaker.allow() and breaker.allow()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[Server]:
    port = _free_port()
    server = Server(
        [_need("redis-server"), "--bind", "127.0.0.1", "--port", str(port), "--dir",
         str(tmp_path), "--save", ""],
        port,
    )  # fmt: skip
    server.start()
    yield server
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGCONT)
    server.stop()


@pytest.mark.timeout(120)
def test_a_blackholed_redis_tier_costs_milliseconds_and_comes_back(
    private_redis: Server, pg_store_factory: StoreFactory
) -> None:
    """A Redis tier that accepts connections and never answers (SIGSTOP: the kernel still
    completes the handshake): once the breaker opens each delivery costs what the durable
    store costs; every new key runs once and every duplicate replays; after SIGCONT and
    the cool-down the tier serves again."""
    durable = pg_store_factory()
    durable.migrate()
    cache = onceonly.open_store(f"redis://127.0.0.1:{private_redis.port}/0")  # 5 s timeouts
    tier = RedisTier(cache)
    store = TieredStore(durable, redis=tier)
    inbox = onceonly.Inbox(store, consumer="c")
    runs: list[str] = []

    def handler(msg: Any, tx: Any) -> str:
        runs.append(msg["id"])
        return f"done {msg['id']}"

    try:
        for i in range(5):
            inbox.process(f"warm-{i}", {"id": f"warm-{i}"}, handler)
        assert inbox.process("warm-0", {"id": "warm-0"}, handler).replayed
        assert store.hits["redis"] == 1
        assert private_redis.proc is not None
        os.kill(private_redis.proc.pid, signal.SIGSTOP)
        latencies = []
        for i in range(40):
            key = f"warm-{i % 5}" if i % 2 else f"sick-{i}"
            started = time.perf_counter()
            outcome = inbox.process(key, {"id": key}, handler)
            latencies.append(time.perf_counter() - started)
            assert outcome.replayed is key.startswith("warm")
        assert sorted(runs) == sorted(
            [f"warm-{i}" for i in range(5)] + [f"sick-{i}" for i in range(0, 40, 2)]
        )
        assert sum(latencies[:5]) < 2.0, latencies[:5]  # before the breaker opens
        after = latencies[5:]
        assert statistics.median(after) < 0.05 and max(after) < 1.0, after  # 0.1 s a call before
        os.kill(private_redis.proc.pid, signal.SIGCONT)
        time.sleep(tier.breaker.cooldown + 0.2)
        assert inbox.process("back-1", {"id": "back-1"}, handler).replayed is False
        hits = store.hits["redis"]
        assert inbox.process("back-1", {"id": "back-1"}, handler).replayed
        assert store.hits["redis"] == hits + 1  # filled and served by Redis again
        assert runs.count("back-1") == 1
    finally:
        if private_redis.proc is not None:
            os.kill(private_redis.proc.pid, signal.SIGCONT)
        store.close()
        cache.close()


# -- (d) a batch through a tiered store


def test_a_batch_through_a_tiered_store_is_one_transaction(
    pg_store_factory: StoreFactory,
) -> None:
    """process_batch on a TieredStore: every message in one PostgreSQL transaction; its
    results are cached once it committed, and a batch rolled back caches nothing."""
    durable = pg_store_factory()
    durable.migrate()
    ledger = f"{durable.table}_ledger"
    with durable.transaction() as s:
        s.execute(f"CREATE TABLE {ledger} (id TEXT PRIMARY KEY, xid TEXT)")
    store = TieredStore(durable, local=LocalTier())
    inbox = onceonly.Inbox(store, consumer="c")
    runs: list[str] = []

    def handler(msg: Any, tx: Any) -> str:
        runs.append(msg["id"])
        if msg.get("lost"):
            raise onceonly.StoreUnavailable("the database went away")
        tx.execute(f"INSERT INTO {ledger} (id, xid) VALUES (?, txid_current()::text)", (msg["id"],))
        return msg["id"]

    items = [(k, {"id": k}) for k in ("a", "b", "c")]
    outcomes = inbox.process_batch(items, handler)
    assert [o.result for o in outcomes] == ["a", "b", "c"]
    with durable.transaction() as s:
        xids = s.execute(f"SELECT DISTINCT xid FROM {ledger}").fetchall()
    assert len(xids) == 1, f"{len(xids)} transactions for one batch"
    again = inbox.process_batch(items, handler)
    assert all(o.replayed for o in again) and store.hits["local"] == 3
    with pytest.raises(onceonly.StoreUnavailable):
        inbox.process_batch([("d", {"id": "d"}), ("e", {"id": "e", "lost": True})], handler)
    assert [o.replayed for o in inbox.process_batch([("d", {"id": "d"})], handler)] == [False]
    assert runs == ["a", "b", "c", "d", "e", "d"]
