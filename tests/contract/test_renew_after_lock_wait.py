# SPDX-License-Identifier: MIT
"""A renewal that waited for a row lock counts its lease from after the wait (spec §1.2).

Another transaction holds the claim's row (SQLite: the database's write lock) for longer
than the lease; the holder's renewal queues behind it. Once the lock is released the
renewal lands, and its new lease must run from then: a healthy holder is not taken over
right after a renewal that succeeded.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any

import psycopg
import pytest

from onceonly._core.state import Policy
from onceonly.errors import InFlight
from onceonly.inbox import Claim, LeasedRunner
from tests.conftest import PG_URL, SQL_KINDS, StoreFactory, _mysql_connect

LEASE = 1.0
HOLD = 1.6  # longer than the lease


@pytest.fixture(params=SQL_KINDS)
def lockable(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    factory = StoreFactory(request.param, tmp_path)
    yield factory
    factory.close()


def _hold_lock(
    factory: StoreFactory, scope: str, key: str, locked: threading.Event, released: list[float]
) -> None:
    """Lock the record, hold it HOLD seconds, and note the store's clock at release."""
    if factory.kind == "sqlite":
        conn = sqlite3.connect(factory.url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        locked.set()
        time.sleep(HOLD)
        released.append(time.time())
        conn.execute("COMMIT")
        conn.close()
    elif factory.kind == "mysql":
        conn = _mysql_connect()
        cur = conn.cursor()
        cur.execute("BEGIN")
        cur.execute(
            f"SELECT 1 FROM `{factory.table}` WHERE scope = %s AND `key` = %s FOR UPDATE",
            (scope.encode(), key.encode()),
        )
        locked.set()
        time.sleep(HOLD)
        cur.execute("SELECT UNIX_TIMESTAMP(SYSDATE(6))")
        released.append(float(cur.fetchone()[0]))
        cur.execute("COMMIT")
        conn.close()
    else:
        with psycopg.connect(PG_URL) as conn:
            conn.execute(
                f"SELECT 1 FROM {factory.table} WHERE scope = %s AND key = %s FOR UPDATE",
                (scope, key),
            )
            locked.set()
            time.sleep(HOLD)
            row = conn.execute("SELECT date_part('epoch', clock_timestamp())").fetchone()
            released.append(float(row[0]))
            conn.commit()


def test_a_renewal_that_waited_for_a_lock_counts_from_after_the_wait(
    lockable: StoreFactory,
) -> None:
    """The renewal's new lease runs from after the lock's release; no takeover follows."""
    store = lockable()
    store.migrate()
    policy = Policy(LEASE, 1)
    holder = LeasedRunner(store, scope="fn", policy=policy, ttl=None, wait=0)
    claim = holder.claim("k", None)
    assert isinstance(claim, Claim)
    locked, released = threading.Event(), []
    locker = threading.Thread(target=_hold_lock, args=(lockable, "fn", "k", locked, released))
    locker.start()
    try:
        assert locked.wait(10)
        with store.session() as s:
            until = s.renew("fn", "k", claim.token, LEASE)  # waits for the lock
    finally:
        locker.join(10)
    assert until is not None and released
    assert until >= released[0] + LEASE - 0.05, (until, released[0])
    # a takeover right after the renewal finds a live claim
    other = LeasedRunner(store, scope="fn", policy=policy, ttl=None, wait=0)
    with pytest.raises(InFlight):
        other.claim("k", None)
