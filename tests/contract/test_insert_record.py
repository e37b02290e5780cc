# SPDX-License-Identifier: MIT
"""What ``session.insert`` / ``session.claim`` return is what the store holds.

Some stores build the inserted record from the values they bound instead of reading it
back (the SQLite store skips ``RETURNING``); the record they hand out must still equal
the row a later read returns, field by field, for every kind of write.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from onceonly._core.state import State, Write

WRITES = {
    "claim": Write(State.IN_PROGRESS, 11, "2:" + "a" * 64, 0, lease_seconds=30.0),
    "atomic": Write(State.COMPLETED, 12, "2:" + "b" * 64, 0, ttl_seconds=600.0, completed=True),
    "forever": Write(State.COMPLETED, 13, None, 0, result='{"a":1}', completed=True),
    "failed": Write(
        State.FAILED, 14, "c:x", 3, error="Boom: x", payload='{"p":1}', checkpoint='{"s":2}'
    ),
    "keep": Write(State.IN_PROGRESS, 15, "2:f", 1, lease_seconds=5.0, keep_checkpoint=True),
}


@pytest.mark.parametrize("kind", list(WRITES))
def test_inserted_record_is_the_stored_row(store: Any, kind: str) -> None:
    """insert() and claim() return exactly the record get() then reads."""
    write = WRITES[kind]
    with store.transaction() as session:
        inserted = session.insert("scope", f"i-{kind}", write)
        snap = session.claim("scope", f"c-{kind}", write)
        again = session.claim("scope", f"c-{kind}", dataclasses.replace(write, token=99))
    assert snap.inserted and not again.inserted
    with store.session() as session:
        stored = session.get("scope", f"i-{kind}").record
        claimed = session.get("scope", f"c-{kind}").record
    assert inserted is not None and stored is not None
    assert inserted == stored
    assert snap.record == claimed == again.record
    assert snap.record is not None and snap.now == snap.record.updated_at
