# SPDX-License-Identifier: MIT
"""Counting attempts at the edges (docs/spec.md §1.3, §1.3.3), as pure functions.

Every failure counts toward ``max_attempts`` except a transient store error. Two cases
need more than :func:`~onceonly._core.state.decide`:

* a worker that dies inside an atomic handler commits nothing, so its attempt is
  counted *before* the run by a precount mark (:func:`precount_write`), which the run's
  own transaction recognises by its token (:func:`precounted_run`) and a transient
  store error gives back (:func:`uncount_write`);
* a failure whose conditional write lost to a concurrent run is counted on the record
  as it is now (:func:`recount_write`), unless that run completed or parked it dead.
"""

from __future__ import annotations

import dataclasses

from onceonly._core.state import (
    Action,
    Decision,
    Expect,
    Policy,
    Record,
    State,
    Write,
    claim_write,
    decide,
    is_expired,
)

INTERRUPTED = "the attempt did not finish (the worker stopped or lost the store)"


def precount_write(
    record: Record | None, now: float, fingerprint: str | None, policy: Policy, token: int
) -> Decision:
    """The mark that counts an attempt *before* it runs (``Inbox(precount_attempts=True)``).

    Atomic mode commits nothing until the handler succeeds, so a message that kills the
    worker would never be counted. The mark is a ``failed`` record under ``token`` whose
    ``attempts`` include the attempt about to run; the run's transaction recognises its
    own mark (:func:`precounted_run`) and overwrites it. Returns a decision whose
    ``write`` is the mark (``None``: nothing to mark, the transaction decides alone:
    completed, dead, a live claim, a mismatch, or attempts already at the limit).
    """
    if record is None or is_expired(record, now):
        mark = Write(
            state=State.FAILED,
            token=token,
            fingerprint=fingerprint,
            attempts=1,
            error=INTERRUPTED,
        )
        expect = None if record is None else Expect(record.token, State.COMPLETED, lapsed=True)
        return Decision(Action.RUN, record, mark, attempt=1, expect=expect)
    decided = decide(record, now, fingerprint, policy, token)
    if (
        decided.action is not Action.RUN
        or record.state is not State.FAILED
        or record.attempts >= policy.max_attempts
    ):
        return Decision(decided.action, record)
    mark = Write(
        state=State.FAILED,
        token=token,
        fingerprint=record.fingerprint,
        attempts=record.attempts + 1,
        error=INTERRUPTED,
        payload=record.payload,
        checkpoint=record.checkpoint,
    )
    return Decision(
        Action.RUN,
        record,
        mark,
        attempt=record.attempts + 1,
        expect=Expect(record.token, State.FAILED),
    )


def precounted_run(record: Record, token: int, policy: Policy) -> Decision:
    """Take the claim over this delivery's own precount mark ``record``.

    The mark already counts the attempt, so the claim carries ``attempts - 1`` failed
    attempts and a failure of this run brings the count back to the mark's.
    """
    return Decision(
        Action.RUN,
        record,
        dataclasses.replace(
            claim_write(record.fingerprint, token, policy, max(record.attempts - 1, 0)),
            checkpoint=record.checkpoint,
            payload=record.payload,
        ),
        attempt=record.attempts,
        expect=Expect(record.token, State.FAILED),
    )


def uncount_write(record: Record) -> Write:
    """Give back a precounted attempt that a transient store error interrupted."""
    return Write(
        state=State.FAILED,
        token=record.token,
        fingerprint=record.fingerprint,
        attempts=max(record.attempts - 1, 0),
        error=record.error,
        payload=record.payload,
        checkpoint=record.checkpoint,
    )


def unrun_write(claimed: Record) -> Write:
    """Give back the claim ``claimed`` whose run never started (a batch's later message,
    whose claim a handler's own ``COMMIT`` committed): ``failed`` with its attempts as
    claimed, so the next delivery runs it without counting this one; the fingerprint,
    payload snapshot and checkpoint stay."""
    return Write(
        state=State.FAILED,
        token=claimed.token,
        fingerprint=claimed.fingerprint,
        attempts=claimed.attempts,
        error=claimed.error or "not run: an earlier handler of its batch ended the transaction",
        payload=claimed.payload,
        checkpoint=claimed.checkpoint,
    )


def recount_write(
    record: Record | None, now: float, error: str, token: int, policy: Policy
) -> tuple[Expect, Write] | None:
    """Count a failure whose own conditional write lost to a concurrent writer.

    Another run changed the record between our read and our failure write; our failed
    attempt must still count, on the record as it is now, unless it has completed (a
    success wins), is dead, or is held by a live claim. Returns the version to expect and
    the write (a new token), or ``None`` when there is nothing to count on.
    """
    if record is None or record.state is not State.FAILED:
        return None
    attempts = record.attempts + 1
    write = Write(
        state=State.DEAD if attempts >= policy.max_attempts else State.FAILED,
        token=token,
        fingerprint=record.fingerprint,
        attempts=attempts,
        error=error,
        payload=record.payload,
        checkpoint=record.checkpoint,
    )
    return Expect(record.token, State.FAILED), write
