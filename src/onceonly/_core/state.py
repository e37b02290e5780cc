# SPDX-License-Identifier: MIT
"""The record state machine (docs/spec.md §2), as pure functions.

States and transitions::

    absent ──claim──────────────▶ in_progress ──complete──▶ completed
                                   │   ▲    │                   │
                         fail      │   │    │ lease lapsed      │ past expires_at:
                                   ▼   │    ▼ (reclaim, new     │ behaves as absent
    dead ◀──attempts ≥ max──── failed ─┘      token, attempt+1)  ▼ (claim again)
      │                      retry: new token
      └── redrive (operator only) ──▶ in_progress

Rules, in the order :func:`decide` applies them to an existing record:

1. A completed record whose ``expires_at`` has passed is treated as absent: the claim
   is taken again with a fresh token, zero attempts and the new fingerprint.
2. A different fingerprint is a :data:`Action.MISMATCH` in every other state. A record
   without a fingerprint (written unchecked, or released unbound) mismatches nothing,
   and a retake stores the incoming fingerprint.
3. ``completed`` → :data:`Action.REPLAY` of the stored result (or cached error).
4. ``dead`` → :data:`Action.DEAD`; only an operator redrive leaves it.
5. ``in_progress`` under the caller's own token is a claim the caller stored but never
   heard about (its reply was lost): it is taken back as it is, not counted
   (:func:`own_claim`). ``in_progress`` with a live lease → :data:`Action.IN_FLIGHT`; with
   a lapsed lease the claim is taken over (new token) and the lapsed run counts as a
   failed attempt; if that reaches ``max_attempts`` the record becomes ``dead`` instead.
6. ``failed`` → retried with a new token while ``attempts < max_attempts``, else dead.

A retaken claim keeps the record's checkpoint and payload snapshot (so a record that
ends ``dead`` can still be redriven). The checkpoint is kept **as the store holds it when
the retake is written** (``Write.keep_checkpoint``), not as it was read: a holder whose
lease lapsed may still save a checkpoint (which renews its lease) between the read and the
write, and its lease may lapse again before the write lands; carrying the checkpoint that
was read would then lose the newer step, and a resumed run would repeat it. Parking as
``dead`` issues a new token, so the worker whose claim lapsed can no longer complete it.

Every write is a :class:`Write`: the whole new row except times, which the store fills in
from its own clock (``lease_seconds`` and ``ttl_seconds`` are relative to the store's now).

**Every update is conditional on the exact version it was decided from** (an
:class:`Expect`: token, state and, when the decision relied on time having passed, that
the lease or the expiry has still lapsed on the store's clock, re-checked in the same
statement). A token names a claim, not a row version: completing, failing or renewing a
claim keeps its token, so a writer that checked only the token could overwrite a
completion or steal a lease renewed after it read the row.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, TypeVar

from onceonly._core.fingerprint import comparable
from onceonly.errors import CorruptRecord

_T = TypeVar("_T")


def one_step_init(cls: type[_T]) -> type[_T]:
    """Give a frozen dataclass an ``__init__`` that sets the instance dict in one step.

    The generated ``__init__`` of a frozen dataclass calls ``object.__setattr__`` once
    per field (about 2 µs for :class:`Record`'s 15, paid on every claim); this one takes
    the same parameters with the same defaults and stores them at once. Only for plain
    fields (no default factory, no ``__post_init__``); tests compare it with the
    dataclass's own.
    """
    params, defaults = [], {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.default_factory is not dataclasses.MISSING or hasattr(cls, "__post_init__"):
            raise TypeError(f"{cls.__name__}.{f.name}: only plain fields are supported")
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            defaults[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    source = (
        f"def __init__(self, {', '.join(params)}):\n"
        f"    _set(self, '__dict__', {{{', '.join(f'{n!r}: {n}' for n in names)}}})\n"
    )
    namespace: dict[str, Any] = {"_set": object.__setattr__, **defaults}
    exec(source, namespace)  # built from the class's own field names only
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


class State(str, enum.Enum):
    """The state of a record."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    DEAD = "dead"

    @classmethod
    def parse(cls, value: str, *, key: str | None = None) -> State:
        """The state stored as ``value``; :class:`CorruptRecord` for an unknown one."""
        try:
            return cls(value)
        except ValueError:
            raise CorruptRecord(
                f"unknown record state {value!r}; refusing to guess", key=key
            ) from None


@one_step_init
@dataclass(frozen=True)
class Record:
    """One stored record, as read from a store. Times are epoch seconds on the store clock."""

    scope: str
    key: str
    state: State
    fingerprint: str | None
    token: int
    attempts: int
    lease_until: float | None = None
    result: str | None = None
    error: str | None = None
    payload: str | None = None
    checkpoint: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    completed_at: float | None = None
    expires_at: float | None = None


@one_step_init
@dataclass(frozen=True)
class Write:
    """The new content of a record. The store stamps the times from its own clock.

    ``lease_seconds``: ``lease_until = now + lease_seconds`` (``None``: no lease).
    ``ttl_seconds``: ``expires_at = now + ttl_seconds`` (``None``: never expires).
    ``completed``: ``completed_at = now``.
    ``keep_checkpoint``: store the checkpoint the record holds at the moment of the write
    (in the same statement) instead of ``checkpoint``; the record returned by the store
    carries the kept value.
    """

    state: State
    token: int
    fingerprint: str | None
    attempts: int
    lease_seconds: float | None = None
    result: str | None = None
    error: str | None = None
    payload: str | None = None
    checkpoint: str | None = None
    ttl_seconds: float | None = None
    completed: bool = False
    keep_checkpoint: bool = False


@dataclass(frozen=True)
class Expect:
    """The version of a record an update was decided from; the store re-checks it.

    ``token`` and ``state`` must still be the record's. With ``lapsed``, the decision
    relied on time: an ``in_progress`` record's lease must still have run out
    (``lease_until`` null or ``<=`` the store's now) and a ``completed`` record must
    still be past ``expires_at``, both read in the same statement as the write.
    """

    token: int
    state: State
    lapsed: bool = False

    @classmethod
    def holder(cls, token: int) -> Expect:
        """What the holder of a leased claim expects: its own ``in_progress`` claim."""
        return cls(token, State.IN_PROGRESS)

    def matches(self, record: Record | None, now: float) -> bool:
        """Whether ``record`` is still this version at ``now`` (the stores' rule in Python)."""
        if record is None or record.token != self.token or record.state is not self.state:
            return False
        if not self.lapsed:
            return True
        if record.state is State.COMPLETED:
            return is_expired(record, now)
        return record.lease_until is None or record.lease_until <= now


@dataclass(frozen=True)
class Policy:
    """What a claim is allowed to do.

    Args:
        lease_seconds: how long a claim is held before another worker may take it over.
        max_attempts: failed attempts after which the record is ``dead`` (>= 1).
    """

    lease_seconds: float
    max_attempts: int = 5

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if not self.lease_seconds > 0:
            raise ValueError("the lease must be positive")


class Action(str, enum.Enum):
    """What the caller of :func:`decide` does next."""

    RUN = "run"  # the claim is yours once ``Decision.write`` is stored: run the handler
    REPLAY = "replay"  # return the stored result (or raise the cached error)
    IN_FLIGHT = "in_flight"  # someone else holds a live claim: wait, then report
    MISMATCH = "mismatch"  # same key, other payload
    DEAD = "dead"  # poison: store ``Decision.write`` if any, then report


@dataclass(frozen=True)
class Decision:
    """The outcome of :func:`decide`.

    ``write`` is what must be stored (insert when ``record`` is None, otherwise an update
    conditional on ``expect``) before acting; ``None`` means nothing to store.
    ``attempt`` is the 1-based number of the run a RUN decision starts.
    """

    action: Action
    record: Record | None
    write: Write | None = None
    attempt: int = 0
    retry_after: float | None = None
    expect: Expect | None = None


def is_expired(record: Record, now: float) -> bool:
    """A completed record past ``expires_at`` behaves as absent."""
    return (
        record.state is State.COMPLETED
        and record.expires_at is not None
        and record.expires_at <= now
    )


def mismatches(record: Record, fingerprint: str | None) -> bool:
    """Rule 2: ``fingerprint`` is another payload than the one ``record`` was stored for
    (both known and of one scheme, and different)."""
    return (
        fingerprint is not None
        and record.fingerprint is not None
        and fingerprint != record.fingerprint
        and comparable(record.fingerprint, fingerprint)
    )


def replays(record: Record, now: float, fingerprint: str | None) -> bool:
    """Whether :func:`decide` answers :data:`Action.REPLAY` for ``record`` at ``now``,
    whatever the policy and token (rules 1 to 3: completed, unexpired, no mismatch).

    For callers that hold a completed record already (a cache tier) and short-cut the
    claim only where the decision would be a replay; anything else goes to the store
    and :func:`decide`. A test compares it with :func:`decide`.
    """
    return (
        record.state is State.COMPLETED
        and not is_expired(record, now)
        and not mismatches(record, fingerprint)
    )


def claim_write(fingerprint: str | None, token: int, policy: Policy, attempts: int = 0) -> Write:
    """The write that takes a claim: ``in_progress`` under ``token`` with a fresh lease."""
    return Write(
        state=State.IN_PROGRESS,
        token=token,
        fingerprint=fingerprint,
        attempts=attempts,
        lease_seconds=policy.lease_seconds,
    )


def dead_write(record: Record, attempts: int, error: str | None, token: int) -> Write:
    """The write that parks ``record`` as ``dead`` under a new ``token``.

    The new token fences off the worker whose lapsed claim led here: it can no longer
    complete or fail the record. Only an operator redrive leaves ``dead``.
    """
    return Write(
        state=State.DEAD,
        token=token,
        fingerprint=record.fingerprint,
        attempts=attempts,
        error=error,
        payload=record.payload,
    )


def decide(
    record: Record | None,
    now: float,
    fingerprint: str | None,
    policy: Policy,
    token: int,
) -> Decision:
    """Decide what a delivery of a key does, given the record the store holds (or None).

    Args:
        record: the committed record, or ``None`` when the key is absent.
        now: the store's current time, epoch seconds.
        fingerprint: the incoming payload's fingerprint (``None``: not checked).
        policy: lease and attempt limits.
        token: the fencing token this delivery claims under: fresh, or the token of an
            earlier claim of the same call whose reply was lost (a record ``in_progress``
            under it is that claim, taken back uncounted).

    Returns:
        A :class:`Decision`; the function has no side effects.
    """
    if record is None:
        return Decision(Action.RUN, None, claim_write(fingerprint, token, policy), attempt=1)
    if is_expired(record, now):
        return Decision(
            Action.RUN,
            record,
            claim_write(fingerprint, token, policy),
            attempt=1,
            expect=Expect(record.token, State.COMPLETED, lapsed=True),
        )
    if mismatches(record, fingerprint):
        return Decision(Action.MISMATCH, record)
    if fingerprint is not None and (
        record.fingerprint is None or not comparable(record.fingerprint, fingerprint)
    ):
        # Stored by another fingerprint scheme, or without one (a claim released
        # unbound): not a mismatch; a retake stores the incoming one, so the key is
        # checked again from then on.
        record_fp: str | None = fingerprint
    else:
        record_fp = record.fingerprint
    state = record.state
    if state is State.COMPLETED:
        return Decision(Action.REPLAY, record)
    if state is State.DEAD:
        return Decision(Action.DEAD, record)
    if state is State.IN_PROGRESS and record.token == token:
        return own_claim(record, record_fp, policy)
    if state is State.IN_PROGRESS:
        lease_until = record.lease_until if record.lease_until is not None else now
        if lease_until > now:
            return Decision(Action.IN_FLIGHT, record, retry_after=lease_until - now)
        lapsed = Expect(record.token, State.IN_PROGRESS, lapsed=True)
        attempts = record.attempts + 1  # the lapsed run counts as a failed attempt
        if attempts >= policy.max_attempts:
            error = record.error or "lease expired (the worker died or stalled)"
            return Decision(
                Action.DEAD, record, dead_write(record, attempts, error, token), expect=lapsed
            )
        return Decision(
            Action.RUN,
            record,
            dataclasses.replace(
                claim_write(record_fp, token, policy, attempts),
                checkpoint=record.checkpoint,
                payload=record.payload,
                keep_checkpoint=True,
            ),
            attempt=attempts + 1,
            expect=lapsed,
        )
    # FAILED
    failed = Expect(record.token, State.FAILED)
    if record.attempts >= policy.max_attempts:
        return Decision(
            Action.DEAD,
            record,
            dead_write(record, record.attempts, record.error, token),
            expect=failed,
        )
    return Decision(
        Action.RUN,
        record,
        dataclasses.replace(
            claim_write(record_fp, token, policy, record.attempts),
            checkpoint=record.checkpoint,
            payload=record.payload,
            keep_checkpoint=True,
        ),
        attempt=record.attempts + 1,
        expect=failed,
    )


def own_claim(record: Record, fingerprint: str | None, policy: Policy) -> Decision:
    """Take back ``record``, a claim this caller stored under its own token but never
    heard about (the reply was lost: spec §2.3.1).

    The caller never ran anything under it, so it is not an attempt: the claim is
    resumed with its attempts as stored (no lapsed run is counted), with a fresh lease,
    whether or not the old one has run out. The write expects the record to still be
    this ``in_progress`` claim under the token: if another worker took it over in the
    meantime, the write fails and the caller reads the record again.
    """
    return Decision(
        Action.RUN,
        record,
        dataclasses.replace(
            claim_write(fingerprint, record.token, policy, record.attempts),
            checkpoint=record.checkpoint,
            payload=record.payload,
            keep_checkpoint=True,
        ),
        attempt=record.attempts + 1,
        expect=Expect.holder(record.token),
    )


def complete_write(record: Record, result: str, ttl_seconds: float | None) -> Write:
    """The write that completes the claim held as ``record`` with an encoded ``result``."""
    return Write(
        state=State.COMPLETED,
        token=record.token,
        fingerprint=record.fingerprint,
        attempts=record.attempts,
        result=result,
        ttl_seconds=ttl_seconds,
        completed=True,
    )


def cached_error_write(record: Record, error: str, result: str, ttl_seconds: float | None) -> Write:
    """Complete with a cached error: duplicates re-raise it instead of running again."""
    return dataclasses.replace(complete_write(record, result, ttl_seconds), error=error)


def fail_write(
    record: Record | None,
    fingerprint: str | None,
    token: int,
    error: str,
    payload: str | None,
    max_attempts: int,
) -> Write:
    """The write that records a failed run of the claim ``record`` (``None``: never stored).

    The payload snapshot is kept so an operator can redrive the message. At
    ``max_attempts`` failures the record becomes ``dead``.
    """
    attempts = (record.attempts if record is not None else 0) + 1
    return Write(
        state=State.DEAD if attempts >= max_attempts else State.FAILED,
        token=token,
        fingerprint=record.fingerprint if record is not None else fingerprint,
        attempts=attempts,
        error=error,
        payload=payload,
        checkpoint=record.checkpoint if record is not None else None,
    )


def redrive_write(record: Record, token: int) -> Write:
    """An operator's redrive of a dead or failed record: failed with zero attempts."""
    return Write(
        state=State.FAILED,
        token=token,
        fingerprint=record.fingerprint,
        attempts=0,
        error=record.error,
        payload=record.payload,
    )
