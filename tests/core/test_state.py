# SPDX-License-Identifier: MIT
"""The pure record state machine: every transition of ``decide`` and every write helper."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

import onceonly
from onceonly._core.state import (
    Action,
    Decision,
    Expect,
    Policy,
    Record,
    State,
    Write,
    cached_error_write,
    complete_write,
    decide,
    fail_write,
    redrive_write,
)

NOW = 1_000.0
TOKEN = 99  # the fresh token offered to decide()
OLD_TOKEN = 7  # the token of the stored record
POLICY = Policy(lease_seconds=30.0, max_attempts=3)
FP = "fp-a"
OTHER_FP = "fp-b"
CHECKPOINT = '{"charged":{"id":"ch_1"}}'


def rec(state: State, **changes: Any) -> Record:
    """A stored record of key ``k`` under ``OLD_TOKEN`` with fingerprint ``FP``."""
    base = Record(
        scope="s",
        key="k",
        state=state,
        fingerprint=FP,
        token=OLD_TOKEN,
        attempts=0,
        created_at=NOW - 500,
        updated_at=NOW - 100,
    )
    return dataclasses.replace(base, **changes)


def claim(
    fingerprint: str | None,
    attempts: int,
    checkpoint: str | None = None,
    payload: str | None = None,
) -> Write:
    """The in_progress write taking the claim under ``TOKEN`` with a fresh lease."""
    return Write(
        state=State.IN_PROGRESS,
        token=TOKEN,
        fingerprint=fingerprint,
        attempts=attempts,
        lease_seconds=POLICY.lease_seconds,
        checkpoint=checkpoint,
        payload=payload,
    )


def retake(
    fingerprint: str | None,
    attempts: int,
    checkpoint: str | None = None,
    payload: str | None = None,
) -> Write:
    """A claim retaken from a failed or lapsed record: it keeps the checkpoint the store
    holds when the write lands (spec §2.4), whatever was read."""
    return dataclasses.replace(
        claim(fingerprint, attempts, checkpoint, payload), keep_checkpoint=True
    )


def dead(record: Record, attempts: int, error: str | None) -> Write:
    """The write parking ``record`` as dead (a new token fences the lapsed worker)."""
    return Write(
        state=State.DEAD,
        token=TOKEN,
        fingerprint=record.fingerprint,
        attempts=attempts,
        error=error,
        payload=record.payload,
    )


COMPLETED = rec(
    State.COMPLETED, result='"r"', completed_at=NOW - 100, expires_at=NOW + 100, attempts=1
)
COMPLETED_FOREVER = rec(State.COMPLETED, result='"r"', completed_at=NOW - 100)
EXPIRED = dataclasses.replace(COMPLETED, expires_at=NOW - 1, checkpoint=CHECKPOINT)
EXPIRING_NOW = dataclasses.replace(COMPLETED, expires_at=NOW)
LIVE = rec(State.IN_PROGRESS, lease_until=NOW + 12.5, attempts=1)
LAPSED = rec(State.IN_PROGRESS, lease_until=NOW - 1, attempts=1, checkpoint=CHECKPOINT)
LAPSING_NOW = rec(State.IN_PROGRESS, lease_until=NOW, attempts=0)
NO_LEASE = rec(State.IN_PROGRESS, lease_until=None, attempts=0)
LAPSED_LAST = rec(
    State.IN_PROGRESS, lease_until=NOW - 1, attempts=2, payload='{"p":1}', checkpoint=CHECKPOINT
)
LAPSED_LAST_WITH_ERROR = dataclasses.replace(LAPSED_LAST, error="ValueError: boom")
FAILED = rec(State.FAILED, attempts=1, error="ValueError: boom", payload='{"p":1}')
FAILED_CHECKPOINTED = dataclasses.replace(FAILED, attempts=2, checkpoint=CHECKPOINT)
REDRIVEN = rec(State.FAILED, attempts=0, error="ValueError: boom")
FAILED_AT_MAX = rec(State.FAILED, attempts=3, error="ValueError: boom", payload='{"p":1}')
FAILED_OVER_MAX = dataclasses.replace(FAILED_AT_MAX, attempts=7)
DEAD = rec(State.DEAD, attempts=3, error="ValueError: boom", payload='{"p":1}')

LEASE_EXPIRED = "lease expired (the worker died or stalled)"


def lapsed(record: Record) -> Expect:
    """A decision that relied on the lease or expiry having run out (re-checked by stores)."""
    return Expect(record.token, record.state, lapsed=True)


def same(record: Record) -> Expect:
    """A decision from the record's token and state alone."""
    return Expect(record.token, record.state)


# (id, stored record, incoming fingerprint, expected decision)
CASES: list[tuple[str, Record | None, str | None, Decision]] = [
    ("absent", None, FP, Decision(Action.RUN, None, claim(FP, 0), attempt=1)),
    ("absent-no-fp", None, None, Decision(Action.RUN, None, claim(None, 0), attempt=1)),
    ("completed", COMPLETED, FP, Decision(Action.REPLAY, COMPLETED)),
    ("completed-forever", COMPLETED_FOREVER, FP, Decision(Action.REPLAY, COMPLETED_FOREVER)),
    (
        "completed-expired",
        EXPIRED,
        OTHER_FP,
        Decision(Action.RUN, EXPIRED, claim(OTHER_FP, 0), attempt=1, expect=lapsed(EXPIRED)),
    ),
    (
        "completed-expires-exactly-now",
        EXPIRING_NOW,
        FP,
        Decision(Action.RUN, EXPIRING_NOW, claim(FP, 0), attempt=1, expect=lapsed(EXPIRING_NOW)),
    ),
    ("completed-other-fp", COMPLETED, OTHER_FP, Decision(Action.MISMATCH, COMPLETED)),
    (
        "in-progress-live",
        LIVE,
        FP,
        Decision(Action.IN_FLIGHT, LIVE, retry_after=12.5),
    ),
    (
        "in-progress-lapsed",
        LAPSED,
        FP,
        Decision(
            Action.RUN,
            LAPSED,
            retake(FP, 2, CHECKPOINT, LAPSED.payload),
            attempt=3,
            expect=lapsed(LAPSED),
        ),
    ),
    (
        "in-progress-lapses-exactly-now",
        LAPSING_NOW,
        FP,
        Decision(Action.RUN, LAPSING_NOW, retake(FP, 1), attempt=2, expect=lapsed(LAPSING_NOW)),
    ),
    (
        "in-progress-without-lease",
        NO_LEASE,
        FP,
        Decision(Action.RUN, NO_LEASE, retake(FP, 1), attempt=2, expect=lapsed(NO_LEASE)),
    ),
    (
        "in-progress-lapsed-reaches-max",
        LAPSED_LAST,
        FP,
        Decision(
            Action.DEAD,
            LAPSED_LAST,
            dead(LAPSED_LAST, 3, LEASE_EXPIRED),
            expect=lapsed(LAPSED_LAST),
        ),
    ),
    (
        "in-progress-lapsed-reaches-max-keeps-error",
        LAPSED_LAST_WITH_ERROR,
        FP,
        Decision(
            Action.DEAD,
            LAPSED_LAST_WITH_ERROR,
            dead(LAPSED_LAST_WITH_ERROR, 3, "ValueError: boom"),
            expect=lapsed(LAPSED_LAST_WITH_ERROR),
        ),
    ),
    (
        "failed",
        FAILED,
        FP,
        Decision(
            Action.RUN,
            FAILED,
            retake(FP, 1, payload=FAILED.payload),
            attempt=2,
            expect=same(FAILED),
        ),
    ),
    (
        "failed-keeps-checkpoint",
        FAILED_CHECKPOINTED,
        FP,
        Decision(
            Action.RUN,
            FAILED_CHECKPOINTED,
            retake(FP, 2, CHECKPOINT, FAILED_CHECKPOINTED.payload),
            attempt=3,
            expect=same(FAILED_CHECKPOINTED),
        ),
    ),
    (
        "failed-redriven",
        REDRIVEN,
        FP,
        Decision(
            Action.RUN,
            REDRIVEN,
            retake(FP, 0, payload=REDRIVEN.payload),
            attempt=1,
            expect=same(REDRIVEN),
        ),
    ),
    (
        "failed-at-max",
        FAILED_AT_MAX,
        FP,
        Decision(
            Action.DEAD,
            FAILED_AT_MAX,
            dead(FAILED_AT_MAX, 3, "ValueError: boom"),
            expect=same(FAILED_AT_MAX),
        ),
    ),
    (
        "failed-over-max",
        FAILED_OVER_MAX,
        FP,
        Decision(
            Action.DEAD,
            FAILED_OVER_MAX,
            dead(FAILED_OVER_MAX, 7, "ValueError: boom"),
            expect=same(FAILED_OVER_MAX),
        ),
    ),
    ("dead", DEAD, FP, Decision(Action.DEAD, DEAD)),
    # rule 2: another payload is a mismatch in every state that is not expired
    ("mismatch-live", LIVE, OTHER_FP, Decision(Action.MISMATCH, LIVE)),
    ("mismatch-lapsed", LAPSED, OTHER_FP, Decision(Action.MISMATCH, LAPSED)),
    ("mismatch-lapsed-last", LAPSED_LAST, OTHER_FP, Decision(Action.MISMATCH, LAPSED_LAST)),
    ("mismatch-failed", FAILED, OTHER_FP, Decision(Action.MISMATCH, FAILED)),
    ("mismatch-failed-at-max", FAILED_AT_MAX, OTHER_FP, Decision(Action.MISMATCH, FAILED_AT_MAX)),
    ("mismatch-dead", DEAD, OTHER_FP, Decision(Action.MISMATCH, DEAD)),
    # no incoming (or no stored) fingerprint: the mismatch check is skipped
    ("no-fp-completed", COMPLETED, None, Decision(Action.REPLAY, COMPLETED)),
    ("no-fp-live", LIVE, None, Decision(Action.IN_FLIGHT, LIVE, retry_after=12.5)),
    ("no-fp-dead", DEAD, None, Decision(Action.DEAD, DEAD)),
    (
        "no-fp-failed-keeps-stored-fp",
        FAILED,
        None,
        Decision(
            Action.RUN,
            FAILED,
            retake(FP, 1, payload=FAILED.payload),
            attempt=2,
            expect=same(FAILED),
        ),
    ),
    (
        "stored-without-fp",
        dataclasses.replace(COMPLETED, fingerprint=None),
        OTHER_FP,
        Decision(Action.REPLAY, dataclasses.replace(COMPLETED, fingerprint=None)),
    ),
]


@pytest.mark.parametrize(
    ("record", "fingerprint", "expected"),
    [pytest.param(r, f, e, id=i) for i, r, f, e in CASES],
)
def test_decide(record: Record | None, fingerprint: str | None, expected: Decision) -> None:
    """decide() gives exactly the expected action, write, attempt and retry_after."""
    assert decide(record, NOW, fingerprint, POLICY, TOKEN) == expected


def test_decide_is_pure() -> None:
    """decide() does not modify its inputs and answers the same twice."""
    before = dataclasses.replace(LAPSED)
    first = decide(LAPSED, NOW, FP, POLICY, TOKEN)
    assert decide(LAPSED, NOW, FP, POLICY, TOKEN) == first
    assert before == LAPSED


def test_decide_max_attempts_one_kills_on_first_lapse() -> None:
    """With max_attempts=1 a lapsed first run is dead at once."""
    policy = Policy(lease_seconds=30.0, max_attempts=1)
    got = decide(NO_LEASE, NOW, FP, policy, TOKEN)
    assert got.action is Action.DEAD
    assert got.write == dead(NO_LEASE, 1, LEASE_EXPIRED)


def test_decide_uses_the_policy_lease() -> None:
    """The claim write carries the policy's lease, relative to the store's now."""
    policy = Policy(lease_seconds=2.5, max_attempts=3)
    got = decide(None, NOW, FP, policy, TOKEN)
    assert got.write is not None
    assert got.write.lease_seconds == 2.5
    assert got.write.ttl_seconds is None
    assert not got.write.completed


def test_complete_write() -> None:
    """Completion keeps the claim's token, fingerprint and attempts, stores result and ttl."""
    claimed = rec(State.IN_PROGRESS, token=TOKEN, lease_until=NOW + 30, attempts=2)
    assert complete_write(claimed, '{"ok":1}', 3600.0) == Write(
        state=State.COMPLETED,
        token=TOKEN,
        fingerprint=FP,
        attempts=2,
        result='{"ok":1}',
        ttl_seconds=3600.0,
        completed=True,
    )


def test_complete_write_without_ttl_never_expires() -> None:
    """A ttl of None is stored as no expiry."""
    claimed = rec(State.IN_PROGRESS, token=TOKEN)
    assert complete_write(claimed, "1", None).ttl_seconds is None


def test_cached_error_write() -> None:
    """A cached error completes the key with the error summary and the encoded error."""
    claimed = rec(State.IN_PROGRESS, token=TOKEN, attempts=1)
    got = cached_error_write(claimed, "KeyError: 'x'", '{"type":"builtins.KeyError"}', 60.0)
    assert got == Write(
        state=State.COMPLETED,
        token=TOKEN,
        fingerprint=FP,
        attempts=1,
        result='{"type":"builtins.KeyError"}',
        error="KeyError: 'x'",
        ttl_seconds=60.0,
        completed=True,
    )


def test_fail_write_first_failure_of_an_unstored_claim() -> None:
    """A failure with no stored record is attempt 1, failed, with the given fingerprint."""
    got = fail_write(None, FP, TOKEN, "ValueError: boom", '{"p":1}', max_attempts=3)
    assert got == Write(
        state=State.FAILED,
        token=TOKEN,
        fingerprint=FP,
        attempts=1,
        error="ValueError: boom",
        payload='{"p":1}',
    )


def test_fail_write_counts_on_the_stored_record() -> None:
    """A failure adds one attempt to the record and keeps its fingerprint and checkpoint."""
    claimed = rec(State.IN_PROGRESS, token=TOKEN, attempts=1, checkpoint=CHECKPOINT)
    got = fail_write(claimed, OTHER_FP, TOKEN, "ValueError: boom", '{"p":1}', max_attempts=3)
    assert got == Write(
        state=State.FAILED,
        token=TOKEN,
        fingerprint=FP,
        attempts=2,
        error="ValueError: boom",
        payload='{"p":1}',
        checkpoint=CHECKPOINT,
    )


@pytest.mark.parametrize(
    ("attempts_before", "max_attempts", "state"),
    [
        (0, 1, State.DEAD),
        (0, 2, State.FAILED),
        (1, 2, State.DEAD),
        (1, 3, State.FAILED),
        (2, 3, State.DEAD),
        (5, 3, State.DEAD),
    ],
)
def test_fail_write_is_dead_at_max_attempts(
    attempts_before: int, max_attempts: int, state: State
) -> None:
    """The failure that reaches max_attempts parks the record as dead, payload kept."""
    claimed = rec(State.IN_PROGRESS, token=TOKEN, attempts=attempts_before)
    got = fail_write(claimed, FP, TOKEN, "ValueError: boom", '{"p":1}', max_attempts)
    assert got.state is state
    assert got.attempts == attempts_before + 1
    assert got.payload == '{"p":1}'
    assert got.error == "ValueError: boom"
    assert got.token == TOKEN


def test_redrive_write() -> None:
    """A redrive makes a dead record failed with zero attempts, keeping error and payload."""
    got = redrive_write(DEAD, TOKEN)
    assert got == Write(
        state=State.FAILED,
        token=TOKEN,
        fingerprint=FP,
        attempts=0,
        error="ValueError: boom",
        payload='{"p":1}',
    )


def test_redriven_record_runs_again() -> None:
    """After a redrive, the next delivery runs as attempt 1."""
    w = redrive_write(DEAD, 11)
    redriven = rec(w.state, token=w.token, attempts=w.attempts, error=w.error, payload=w.payload)
    got = decide(redriven, NOW, FP, POLICY, TOKEN)
    assert got.action is Action.RUN
    assert got.attempt == 1


@pytest.mark.parametrize("state", list(State))
def test_state_parse_known(state: State) -> None:
    """Every stored state text parses to its member."""
    assert State.parse(state.value) is state


@pytest.mark.parametrize("text", ["running", "", "COMPLETED", "completed "])
def test_state_parse_unknown_is_corrupt(text: str) -> None:
    """An unknown state is a CorruptRecord (a StoreError), naming the key."""
    with pytest.raises(onceonly.CorruptRecord, match="unknown record state") as info:
        State.parse(text, key="k-1")
    assert info.value.key == "k-1"
    assert isinstance(info.value, onceonly.StoreError)


@pytest.mark.parametrize("max_attempts", [0, -1])
def test_policy_rejects_max_attempts_below_one(max_attempts: int) -> None:
    """max_attempts must be at least 1."""
    with pytest.raises(ValueError, match="max_attempts"):
        Policy(lease_seconds=30.0, max_attempts=max_attempts)


@pytest.mark.parametrize("lease", [0.0, -1.0, math.nan])
def test_policy_rejects_non_positive_lease(lease: float) -> None:
    """The lease must be a positive number of seconds."""
    with pytest.raises(ValueError, match="lease"):
        Policy(lease_seconds=lease)


def test_policy_minimums_are_accepted() -> None:
    """max_attempts=1 and a tiny positive lease are valid."""
    policy = Policy(lease_seconds=0.001, max_attempts=1)
    assert policy.max_attempts == 1
    assert Policy(lease_seconds=1.0).max_attempts == 5


def test_fingerprints_of_another_scheme_are_not_a_mismatch() -> None:
    """A record fingerprinted by an older scheme replays; a retake stores the new one."""
    old = "a" * 64  # scheme 1: a bare hex digest
    new = "2:" + "b" * 64
    completed = rec(State.COMPLETED, fingerprint=old, result='"ok"', expires_at=NOW + 60)
    assert decide(completed, NOW, new, POLICY, TOKEN).action is Action.REPLAY
    failed = rec(State.FAILED, fingerprint=old, attempts=1)
    decision = decide(failed, NOW, new, POLICY, TOKEN)
    assert decision.action is Action.RUN
    assert decision.write is not None and decision.write.fingerprint == new
    # same scheme, other payload: still a mismatch
    assert (
        decide(
            dataclasses.replace(failed, fingerprint=new), NOW, "2:" + "c" * 64, POLICY, TOKEN
        ).action
        is Action.MISMATCH
    )
