# SPDX-License-Identifier: MIT
"""The operator decisions of _core/admin.py (spec §8), pure."""

from __future__ import annotations

import dataclasses

import pytest

import onceonly
from onceonly._core.admin import (
    LAPSED_ERROR,
    PurgeRule,
    Query,
    purge_qualifies,
    reap_decision,
    redrive_decision,
)
from onceonly._core.state import Expect, Record, State

NOW = 1_000.0
BASE = Record("s", "k", State.COMPLETED, "fp", 7, 1, updated_at=900.0, expires_at=950.0)


def rec(**changes: object) -> Record:
    return dataclasses.replace(BASE, **changes)  # type: ignore[arg-type]


def test_purge_qualifies() -> None:
    """Completed past expiry (+ older_than); failed/dead only if included; never in progress."""
    assert purge_qualifies(BASE, NOW, PurgeRule())
    assert not purge_qualifies(BASE, NOW, PurgeRule(older_than=51))
    assert not purge_qualifies(rec(expires_at=None), NOW, PurgeRule())
    assert not purge_qualifies(rec(expires_at=1_001.0), NOW, PurgeRule())
    assert not purge_qualifies(BASE, NOW, PurgeRule(scope="other"))
    for state in (State.FAILED, State.DEAD):
        assert not purge_qualifies(rec(state=state), NOW, PurgeRule())
        assert purge_qualifies(rec(state=state), NOW, PurgeRule(include_dead=True))
        assert not purge_qualifies(
            rec(state=state), NOW, PurgeRule(include_dead=True, older_than=101)
        )
    lapsed = rec(state=State.IN_PROGRESS, lease_until=0.0, expires_at=10.0)
    assert not purge_qualifies(lapsed, NOW, PurgeRule(include_dead=True))
    with pytest.raises(onceonly.ConfigurationError):
        PurgeRule(older_than=-1)


def test_reap_decision_counts_the_lapse_and_fences() -> None:
    """A lapsed claim: failed, attempts + 1, a new token, expecting the lapsed version."""
    lapsed = rec(state=State.IN_PROGRESS, lease_until=NOW, checkpoint="c", payload="p")
    decision = reap_decision(lapsed, NOW, 99)
    assert decision is not None
    expect, write = decision
    assert expect == Expect(7, State.IN_PROGRESS, lapsed=True)
    assert (write.state, write.attempts, write.token) == (State.FAILED, 2, 99)
    assert (write.error, write.checkpoint, write.payload) == (LAPSED_ERROR, "c", "p")
    assert reap_decision(rec(state=State.IN_PROGRESS, lease_until=NOW + 1), NOW, 99) is None
    assert reap_decision(BASE, NOW, 99) is None
    kept = reap_decision(dataclasses.replace(lapsed, error="boom"), NOW, 99)
    assert kept is not None and kept[1].error == "boom"


def test_redrive_decision() -> None:
    """Dead and failed are redriven (failed, zero attempts, new token); others are not."""
    for state in (State.DEAD, State.FAILED):
        decision = redrive_decision(rec(state=state, attempts=5), 42)
        assert decision is not None
        assert decision[0] == Expect(7, state)
        assert (decision[1].state, decision[1].attempts, decision[1].token) == (
            State.FAILED,
            0,
            42,
        )
    assert redrive_decision(BASE, 42) is None
    assert redrive_decision(rec(state=State.IN_PROGRESS), 42) is None


def test_query_matches() -> None:
    """States, scope, age, lapsed and the (scope, key) cursor."""
    assert Query().matches(BASE, NOW)
    assert not Query(states=(State.DEAD,)).matches(BASE, NOW)
    assert not Query(scope="x").matches(BASE, NOW)
    assert Query(older_than=100).matches(BASE, NOW)
    assert not Query(older_than=101).matches(BASE, NOW)
    assert not Query(lapsed=True).matches(BASE, NOW)
    assert Query(lapsed=True).matches(rec(state=State.IN_PROGRESS, lease_until=NOW), NOW)
    assert Query(after=("s", "j")).matches(BASE, NOW)
    assert not Query(after=("s", "k")).matches(BASE, NOW)
