# SPDX-License-Identifier: MIT
"""The edges of the state machine (docs/spec.md §2), with interleaved actors.

Each test is a reproducer of a bug a review found: a second actor runs at the exact
point between another actor's read and its conditional write (a :class:`Hooked` store
runs it there), or the handler breaks its own transaction, or the store goes away.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psycopg
import pytest

import onceonly
from onceonly._core.state import Policy, State
from onceonly.inbox import LeasedRunner
from tests.conftest import PG_URL, StoreFactory, business_table, require_postgres

LEASE = 0.3


class _HookedSession:
    def __init__(self, session: Any, owner: Hooked) -> None:
        self._session = session
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._session, name)
        if not callable(attr) or name not in self._owner.methods:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._owner.reached(name)
            return attr(*args, **kwargs)

        return call


class Hooked:
    """A store that runs ``hook`` once, just before the ``nth`` call named ``on``.

    ``on`` is a session method (``update``, ``renew``, …) or ``transaction``. With
    ``methods=...`` the named session methods are replaced by ``fake`` instead.
    """

    def __init__(
        self, store: Any, *, on: str, nth: int = 1, hook: Callable[[], None] | None = None
    ) -> None:
        self._store = store
        self._on = on
        self._nth = nth
        self._hook = hook
        self._calls = 0
        self.methods = {on}

    def reached(self, name: str) -> None:
        if name != self._on:
            return
        self._calls += 1
        if self._calls == self._nth and self._hook is not None:
            self._hook()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    @contextmanager
    def session(self) -> Iterator[Any]:
        with self._store.session() as s:
            yield _HookedSession(s, self)

    @contextmanager
    def transaction(self, connection: Any = None, *, lock_wait: float = 5.0) -> Iterator[Any]:
        self.reached("transaction")
        with self._store.transaction(connection, lock_wait=lock_wait) as s:
            yield _HookedSession(s, self)


class _FrozenRenewals:
    """A store whose renewals do nothing: its holder stalls as if SIGSTOPped."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    @contextmanager
    def session(self) -> Iterator[Any]:
        with self._store.session() as s:
            yield _NoRenew(s)


class _NoRenew:
    def __init__(self, session: Any) -> None:
        self._session = session

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def renew(self, *args: Any) -> float:
        return time.time() + 3600.0  # claims success, changes nothing


def runner(store: Any, *, max_attempts: int = 5, wait: float = 0.2, **kw: Any) -> LeasedRunner:
    return LeasedRunner(
        store, scope="fn", policy=Policy(LEASE, max_attempts), ttl=None, wait=wait, **kw
    )


class StalledHolder:
    """Worker A: claims ``k``, then stalls (no renewals) until released, then completes."""

    def __init__(self, store: Any, scope_runner: LeasedRunner, effects: list[str]) -> None:
        self.effects = effects
        self.started = threading.Event()
        self.go = threading.Event()
        self.done = threading.Event()
        self.outcome: list[Any] = []
        self._runner = scope_runner

        def fn() -> str:
            self.started.set()
            assert self.go.wait(10)
            self.effects.append("A")
            return "A"

        def run() -> None:
            try:
                self.outcome.append(self._runner.run("k", None, fn))
            except BaseException as exc:  # inspected by the test
                self.outcome.append(exc)
            finally:
                self.done.set()

        self.thread = threading.Thread(target=run, daemon=True)

    def start_and_lapse(self) -> None:
        self.thread.start()
        assert self.started.wait(10)
        time.sleep(LEASE + 0.2)  # its lease runs out on the store's clock

    def complete_now(self) -> None:
        self.go.set()
        assert self.done.wait(10)


def read(store: Any, scope: str, key: str) -> Any:
    with store.session() as s:
        return s.get(scope, key).record


# -- 1. a takeover never overwrites a completion committed after its read


@pytest.mark.parametrize("max_attempts", [5, 1], ids=["takeover", "dead-write"])
def test_takeover_loses_to_a_completion_committed_after_its_read(
    leased_store: Any, max_attempts: int
) -> None:
    """B reads A's lapsed claim; A completes; B's takeover (or dead write) must fail."""
    effects: list[str] = []
    a = StalledHolder(
        leased_store, runner(_FrozenRenewals(leased_store), max_attempts=max_attempts), effects
    )
    a.start_and_lapse()
    b = runner(Hooked(leased_store, on="update", hook=a.complete_now), max_attempts=max_attempts)

    def fn_b() -> str:
        effects.append("B")
        return "B"

    result, replayed, _ = b.run("k", None, fn_b)
    assert effects == ["A"]
    assert (result, replayed) == ("A", True)
    assert a.outcome[0][:2] == ("A", False)
    record = read(leased_store, "fn", "k")
    assert record.state is State.COMPLETED and record.result == '"A"'


@pytest.fixture(params=["memory", "postgres"])
def unlocked_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Stores whose transactions let another connection write between two statements
    (SQLite's BEGIN IMMEDIATE serialises whole transactions, so it cannot interleave)."""
    factory = StoreFactory(request.param, tmp_path)
    yield factory
    factory.close()


def test_atomic_takeover_loses_to_a_completion_committed_after_its_read(
    unlocked_factory: StoreFactory,
) -> None:
    """The inbox's takeover of a lapsed leased claim is fenced on the version too."""
    store = unlocked_factory()
    store.migrate()
    effects: list[str] = []
    leased = LeasedRunner(
        _FrozenRenewals(store), scope="billing", policy=Policy(LEASE, 5), ttl=None, wait=0.2
    )
    a = StalledHolder(store, leased, effects)
    a.start_and_lapse()
    inbox = onceonly.Inbox(Hooked(store, on="update", hook=a.complete_now), consumer="billing")

    def handler(msg: Any, tx: Any) -> str:
        effects.append("B")
        return "B"

    outcome = inbox.process("k", {"n": 1}, handler)
    assert effects == ["A"]
    assert outcome.replayed and outcome.result == "A"


def test_atomic_dead_write_loses_to_a_completion_committed_after_its_read(
    unlocked_factory: StoreFactory,
) -> None:
    """The inbox's dead write of a lapsed claim (its last attempt) is fenced and checked:
    when the holder completes between the read and the write, the delivery reads the key
    again and replays the completion instead of reporting it dead."""
    store = unlocked_factory()
    store.migrate()
    effects: list[str] = []
    leased = LeasedRunner(
        _FrozenRenewals(store), scope="billing", policy=Policy(LEASE, 1), ttl=None, wait=0.2
    )
    a = StalledHolder(store, leased, effects)
    a.start_and_lapse()
    inbox = onceonly.Inbox(
        Hooked(store, on="update", hook=a.complete_now), consumer="billing", max_attempts=1
    )

    def handler(msg: Any, tx: Any) -> str:
        effects.append("B")
        return "B"

    outcome = inbox.process("k", {"n": 1}, handler)
    assert effects == ["A"]
    assert outcome.replayed and outcome.result == "A"
    assert read(store, "billing", "k").state is State.COMPLETED


# -- 2. a takeover never steals a lease renewed after its read


def test_takeover_cannot_steal_a_lease_renewed_after_its_read(leased_store: Any) -> None:
    """B reads A's lapsed lease; A renews; B's takeover fails and A still holds the key."""
    a = runner(leased_store).claim("k", None)
    assert isinstance(a, onceonly.Claim)
    time.sleep(LEASE + 0.2)

    def a_renews() -> None:
        with leased_store.session() as s:
            assert s.renew("fn", "k", a.token, 30.0) is not None

    ran: list[str] = []
    b = runner(Hooked(leased_store, on="update", hook=a_renews), wait=0.3)
    with pytest.raises(onceonly.InFlight):
        b.run("k", None, lambda: ran.append("B"))
    assert ran == []
    record = read(leased_store, "fn", "k")
    assert record.token == a.token and record.state is State.IN_PROGRESS


def test_takeover_cannot_discard_a_checkpoint_saved_after_its_read(leased_store: Any) -> None:
    """A checkpoint is a sign of life: it renews the lease, so a takeover read before
    it fails instead of restarting the work from an older checkpoint."""
    a = runner(leased_store).claim("k", None)
    assert isinstance(a, onceonly.Claim)
    time.sleep(LEASE + 0.2)
    b = runner(
        Hooked(leased_store, on="update", hook=lambda: a.checkpoint("charged", 1)), wait=0.05
    )
    with pytest.raises(onceonly.InFlight):
        b.run("k", None, lambda: "B")
    assert read(leased_store, "fn", "k").token == a.token


# -- 3. a handler that ends the inbox's transaction is never reported done


@pytest.mark.parametrize("how", ["commit", "rollback", "context"])
def test_handler_that_ends_the_transaction_is_a_counted_failure(sql_store: Any, how: str) -> None:
    """Committing or rolling back tx.connection is refused or TransactionEnded, never success."""
    count = business_table(sql_store)
    table = f"{sql_store.table}_ledger"
    inbox = onceonly.Inbox(sql_store, consumer="billing")
    sqlite = sql_store.dialect == "sqlite"

    def handler(msg: Any, tx: Any) -> int:
        tx.execute(f"INSERT INTO {table} (id, amount) VALUES (?, ?)", ("k", 1))
        conn = tx.connection
        if how == "commit":
            conn.commit()
        elif how == "rollback":
            conn.rollback()
        elif sqlite:
            with conn:  # sqlite3's context manager commits
                pass
        else:
            conn.commit()
        return 1

    # psycopg 3 and sqlite3 refuse the call itself (nothing ends); MySQL's drivers cannot
    # be made to, and the inbox finds the transaction ended before COMMIT
    refused = (onceonly.TransactionEnded, sqlite3.DatabaseError, psycopg.ProgrammingError)
    with pytest.raises(refused):
        inbox.process("k", {"n": 1}, handler)
    record = read(sql_store, "billing", "k")
    assert record is not None
    assert record.state is State.FAILED and record.attempts == 1
    # a well-behaved redelivery runs and completes
    before = count()

    def good(msg: Any, tx: Any) -> int:
        tx.execute(f"INSERT INTO {table} (id, amount) VALUES (?, ?)", ("k", 2))
        return 2

    outcome = inbox.process("k", {"n": 1}, good)
    assert not outcome.replayed and count() == before + 1


# -- 4. atomic mode: the ttl runs from completion


def test_atomic_ttl_runs_from_completion(store: Any) -> None:
    """A handler longer than the ttl still leaves a live record: duplicates replay."""
    inbox = onceonly.Inbox(store, consumer="billing", ttl=0.5)
    runs: list[int] = []

    def slow(msg: Any, tx: Any) -> None:
        runs.append(1)
        time.sleep(0.7)

    assert not inbox.process("k", {"n": 1}, slow).replayed
    assert inbox.process("k", {"n": 1}, slow).replayed
    assert runs == [1]


# -- 5. leased completion survives connections the server dropped while idle


def test_leased_completion_survives_dropped_idle_connections() -> None:
    """PostgreSQL dropped the pool's idle connections while the function ran: the
    fenced completion still lands (checked pool connections, bounded retries)."""
    require_postgres()
    app = f"onceonly_{uuid.uuid4().hex[:10]}"
    table = f"t_{uuid.uuid4().hex[:12]}"
    store = onceonly.open_store(
        f"{PG_URL}?application_name={app}", table=table, min_size=2, max_size=2
    )
    try:
        store.migrate()
        effects: list[int] = []

        def fn() -> str:
            effects.append(1)
            with psycopg.connect(PG_URL, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (app,),
                )
            time.sleep(1.2)  # idle long enough for the pool to check them at checkout
            return "done"

        r = LeasedRunner(store, scope="fn", policy=Policy(30.0, 5), ttl=None, wait=1.0)
        assert r.run("k", None, fn)[:2] == ("done", False)
        assert r.run("k", None, fn)[:2] == ("done", True)
        assert effects == [1]
    finally:
        store.close()
        from tests.conftest import drop_pg_table

        drop_pg_table(table)


# -- 6. leased mode: a result that cannot be stored never re-runs the effect


def test_unstorable_leased_result_completes_with_an_error(leased_store: Any) -> None:
    """The effect happened; the key is completed with the error, not failed."""
    effects: list[int] = []
    r = runner(leased_store, max_result_bytes=64)

    def fn() -> str:
        effects.append(1)
        return "x" * 1000

    with pytest.raises(onceonly.TooLarge):
        r.run("k", None, fn)
    with pytest.raises(onceonly.OnceOnlyError, match="could not be stored"):
        r.run("k", None, fn)
    assert effects == [1]


# -- 7. every failure is counted


def test_swallowed_database_error_is_a_counted_failure(pg_store_factory: StoreFactory) -> None:
    """A handler that catches a PostgreSQL error leaves the transaction aborted: the
    attempt raises TransactionAborted and counts, so max_attempts applies."""
    store = pg_store_factory()
    store.migrate()
    inbox = onceonly.Inbox(store, consumer="billing", max_attempts=2)

    def handler(msg: Any, tx: Any) -> int:
        with suppress(psycopg.errors.UndefinedTable):
            tx.execute("SELECT * FROM no_such_table_here")
        return 1

    for _ in range(2):
        with pytest.raises(onceonly.TransactionAborted):
            inbox.process("k", {"n": 1}, handler)
    with pytest.raises(onceonly.DeadLettered):
        inbox.process("k", {"n": 1}, handler)


def test_error_text_that_no_store_can_hold_is_still_counted(store: Any) -> None:
    """NUL characters and lone surrogates in an error message still record the failure."""
    inbox = onceonly.Inbox(store, consumer="billing", max_attempts=2)

    def handler(msg: Any, tx: Any) -> int:
        raise ValueError("bad\x00byte \ud800 here")

    for _ in range(2):
        with pytest.raises(ValueError):
            inbox.process("k", {"n": 1}, handler)
    with pytest.raises(onceonly.DeadLettered):
        inbox.process("k", {"n": 1}, handler)


class Crash(BaseException):
    """Stands for the process dying inside the handler: nothing of the run commits."""


def test_precounted_attempts_dead_letter_a_message_that_kills_the_worker(store: Any) -> None:
    """With precount_attempts, crashes count: the key ends dead after max_attempts."""
    inbox = onceonly.Inbox(store, consumer="billing", max_attempts=3, precount_attempts=True)
    runs: list[int] = []

    def handler(msg: Any, tx: Any) -> int:
        runs.append(tx.attempt)
        raise Crash

    for _ in range(3):
        with pytest.raises(Crash):
            inbox.process("k", {"n": 1}, handler)
    with pytest.raises(onceonly.DeadLettered):
        inbox.process("k", {"n": 1}, handler)
    assert runs == [1, 2, 3]


def test_precount_keeps_ordinary_counting(store: Any) -> None:
    """Precounted failures and successes count exactly as without the precount."""
    inbox = onceonly.Inbox(store, consumer="billing", max_attempts=3, precount_attempts=True)
    attempts: list[int] = []

    def flaky(msg: Any, tx: Any) -> int:
        attempts.append(tx.attempt)
        if tx.attempt < 3:
            raise ValueError("not yet")
        return tx.attempt

    for _ in range(2):
        with pytest.raises(ValueError):
            inbox.process("k", {"n": 1}, flaky)
    assert read(store, "billing", "k").attempts == 2
    outcome = inbox.process("k", {"n": 1}, flaky)
    assert (outcome.result, outcome.attempt, outcome.replayed) == (3, 3, False)
    assert inbox.process("k", {"n": 1}, flaky).replayed
    assert attempts == [1, 2, 3]


def test_failure_that_loses_to_a_concurrent_failure_is_still_counted(store: Any) -> None:
    """A's failure write loses to B's (which changed the token): A's still counts."""
    inbox_b = onceonly.Inbox(store, consumer="billing", max_attempts=5)

    def boom(msg: Any, tx: Any) -> int:
        raise ValueError("boom")

    def b_fails() -> None:
        with pytest.raises(ValueError):
            inbox_b.process("k", {"n": 1}, boom)

    # A's second transaction is the one that records its failure
    inbox_a = onceonly.Inbox(
        Hooked(store, on="transaction", nth=2, hook=b_fails), consumer="billing", max_attempts=5
    )
    with pytest.raises(ValueError):
        inbox_a.process("k", {"n": 1}, boom)
    assert read(store, "billing", "k").attempts == 2


# -- 8. a lost connection is transient: never an attempt


def test_connection_lost_in_the_handler_is_not_an_attempt(pg_store_factory: StoreFactory) -> None:
    """The handler's connection dies: StoreUnavailable, and no attempt is consumed."""
    store = pg_store_factory()
    store.migrate()
    inbox = onceonly.Inbox(store, consumer="billing", max_attempts=2)

    def dies(msg: Any, tx: Any) -> int:
        tx.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        return 1

    for _ in range(3):
        with pytest.raises(onceonly.StoreUnavailable):
            inbox.process("k", {"n": 1}, dies)
    record = read(store, "billing", "k")
    assert record is None or record.attempts == 0
    assert inbox.process("k", {"n": 1}, lambda m, tx: 7).result == 7


# -- 17. limits that used to fail late


@pytest.mark.parametrize("wait", [float("inf"), 1e300])
def test_unbounded_wait_is_accepted(store: Any, wait: float) -> None:
    """wait=inf means no limit; it must not overflow a store's lock timeout."""
    inbox = onceonly.Inbox(store, consumer="billing", wait=wait)
    assert inbox.process("k", {"n": 1}, lambda m, tx: 1).result == 1


def test_ttl_past_what_a_store_can_hold_is_refused_up_front(store: Any) -> None:
    """timedelta.max is refused by the constructor, not by every later claim."""
    import datetime as dt

    with pytest.raises(onceonly.ConfigurationError, match="ttl"):
        onceonly.Inbox(store, consumer="billing", ttl=dt.timedelta.max)
