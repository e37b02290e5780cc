# SPDX-License-Identifier: MIT
"""A dropped connection at every store operation (docs/spec.md §1.3.2, §2.4).

For each operation a flow performs, the server terminates the connection right before
that operation runs. Whatever happens, only ``OnceOnlyError`` subclasses escape, the
record is left in a state the state machine allows, and a clean redelivery ends with
exactly one effect.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
import pytest

import onceonly
from onceonly._core.state import Policy, State
from onceonly.inbox import LeasedRunner
from tests.conftest import PG_URL, StoreFactory, _mysql_connect, business_table


@pytest.fixture(params=["postgres", "mysql"])
def severable_factory(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[StoreFactory]:
    """Stores of a server whose connections can be terminated from outside."""
    factory = StoreFactory(request.param, tmp_path)
    yield factory
    factory.close()


class Severing:
    """A store whose session terminates its own connection before the nth ``op``."""

    def __init__(self, store: Any, op: str, nth: int) -> None:
        self._store = store
        self.op = op
        self.nth = nth
        self.calls = 0
        self.fired = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def _cut(self, session: Any) -> None:
        conn = session.connection
        if isinstance(conn, psycopg.Connection):
            with psycopg.connect(PG_URL, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        else:  # MariaDB/MySQL
            admin = _mysql_connect()
            try:
                admin.cursor().execute("KILL CONNECTION %s", (conn.thread_id(),))
            finally:
                admin.close()
        time.sleep(0.05)
        self.fired = True

    @contextmanager
    def session(self) -> Iterator[Any]:
        with self._store.session() as s:
            yield _Severed(s, self)

    @contextmanager
    def transaction(self, connection: Any = None, *, lock_wait: float = 5.0) -> Iterator[Any]:
        with self._store.transaction(connection, lock_wait=lock_wait) as s:
            yield _Severed(s, self)


class _Severed:
    def __init__(self, session: Any, owner: Severing) -> None:
        self._session = session
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._session, name)
        owner = self._owner
        if name != owner.op:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            owner.calls += 1
            if owner.calls == owner.nth:
                owner._cut(self._session)
            return attr(*args, **kwargs)

        return call


def allowed(record: Any) -> bool:
    """A record a dropped connection may leave: nothing, a claim, a counted-free failure,
    or the completion itself."""
    return record is None or record.state in (State.IN_PROGRESS, State.FAILED, State.COMPLETED)


LEASED_OPS = [("claim", 1), ("update", 1), ("save_checkpoint", 1)]


@pytest.mark.parametrize(("op", "nth"), LEASED_OPS)
def test_leased_flow_survives_a_dropped_connection_at(
    severable_factory: StoreFactory, op: str, nth: int
) -> None:
    """Leased mode: a cut at any operation ends typed, and a redelivery completes once."""
    store = severable_factory()
    store.migrate()
    effects: list[int] = []

    def fn() -> str:
        claim = onceonly.current_claim()
        claim.checkpoint("charged", 1)
        effects.append(1)  # the external effect, after the checkpoint
        return "ok"

    faulty = Severing(store, op, nth)
    r = LeasedRunner(faulty, scope="fn", policy=Policy(0.5, 5), ttl=None, wait=0.1)
    with suppress(onceonly.OnceOnlyError):  # typed is fine; a raw driver error fails
        r.run("k", None, fn)
    assert faulty.fired
    with store.session() as s:
        assert allowed(s.get("fn", "k").record)
    clean = LeasedRunner(store, scope="fn", policy=Policy(0.5, 5), ttl=None, wait=3.0)
    result, _, _ = clean.run("k", None, fn)
    assert result == "ok"
    assert effects == [1]
    with store.session() as s:
        record = s.get("fn", "k").record
    assert record.state is State.COMPLETED and record.attempts == 0


ATOMIC_OPS = [("claim", 1), ("execute", 1), ("update", 1)]


@pytest.mark.parametrize(("op", "nth"), ATOMIC_OPS)
def test_atomic_flow_survives_a_dropped_connection_at(
    severable_factory: StoreFactory, op: str, nth: int
) -> None:
    """Atomic mode: a cut at any operation rolls everything back, is not counted, and a
    redelivery writes the business row exactly once."""
    store = severable_factory()
    store.migrate()
    count = business_table(store)
    table = f"{store.table}_ledger"

    def handler(msg: Any, tx: Any) -> dict[str, int]:
        tx.execute(f"INSERT INTO {table} (id, amount) VALUES (?, ?)", ("k", 1))
        return {"charged": 1}

    faulty = Severing(store, op, nth)
    with pytest.raises(onceonly.StoreUnavailable):
        onceonly.Inbox(faulty, consumer="billing", max_attempts=1).process("k", {"n": 1}, handler)
    assert faulty.fired
    with store.session() as s:
        record = s.get("billing", "k").record
    assert record is None or record.attempts == 0
    assert count() == 0
    outcome = onceonly.Inbox(store, consumer="billing", max_attempts=1).process(
        "k", {"n": 1}, handler
    )
    assert outcome.result == {"charged": 1} and not outcome.replayed
    assert count() == 1
