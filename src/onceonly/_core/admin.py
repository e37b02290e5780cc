# SPDX-License-Identifier: MIT
"""Operator decisions (docs/spec.md §8): which records retention, the reaper and a
redrive touch, and what they write. Pure: record and time in, decision out.

* **Purge** (retention) deletes ``completed`` records whose ``expires_at`` passed at
  least ``older_than`` seconds ago; ``failed`` and ``dead`` records are kept unless
  asked (``include_dead``: those last written at least ``older_than`` seconds ago).
  ``in_progress`` records are never purged. The SQL stores express the same predicate
  in the delete statement itself, so the row is re-checked where it is deleted.
* **Reap** moves an ``in_progress`` record whose lease has lapsed to ``failed``. The
  lapsed run counts as a failed attempt, exactly as a takeover by the next delivery
  counts it (DESIGN §2, :func:`onceonly._core.state.decide` rule 5), so reaping never
  changes how many runs a message gets before it is ``dead``: the next delivery sees
  ``failed`` with the same attempts a takeover would have computed. The write carries
  a new token (the lapsed worker can no longer renew, complete or fail it) and expects
  the version it decided from with ``lapsed`` (re-checked on the store's clock), so a
  worker that renews or completes first wins.
* **Redrive** is :func:`onceonly._core.state.redrive_write` (``failed``, zero
  attempts, a new token), allowed from ``dead`` and ``failed`` only and conditional on
  the version read.
* **Delete** of one record is conditional on the version read (its token and state).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from onceonly._core.state import Expect, Record, State, Write, redrive_write
from onceonly.errors import ConfigurationError

__all__ = [
    "BUCKET_SECONDS",
    "LAPSED_ERROR",
    "PurgeRule",
    "Query",
    "ScopeStats",
    "ascii_lower",
    "purge_qualifies",
    "reap_decision",
    "redrive_decision",
]

LAPSED_ERROR = "lease expired (the worker died or stalled); reaped"
# Delivery counters are kept per scope per bucket of this many seconds (spec §8.4).
BUCKET_SECONDS = 60


@dataclass(frozen=True)
class Query:
    """Which records an operator lists (a store's ``scan``).

    Attributes:
        states: only these states (empty: every state).
        scope: only this scope.
        older_than: only records last written at least this many seconds ago.
        lapsed: only ``in_progress`` records whose lease has run out.
        after: resume after this ``(scope, key)`` (records come in that order).
        limit: at most this many records.
        key_prefix: only keys starting with this text (case-sensitive).
        error_contains: only records whose error contains this text, ignoring the case
            of ASCII letters.

    .. versionchanged:: 0.3
       ``key_prefix`` and ``error_contains``.
    """

    states: tuple[State, ...] = ()
    scope: str | None = None
    older_than: float | None = None
    lapsed: bool = False
    after: tuple[str, str] | None = None
    limit: int = 100
    key_prefix: str | None = None
    error_contains: str | None = None

    def matches(self, record: Record, now: float) -> bool:
        """Whether ``record`` qualifies at ``now`` (the stores' predicate in Python)."""
        if self.states and record.state not in self.states:
            return False
        if self.scope is not None and record.scope != self.scope:
            return False
        if self.older_than is not None and record.updated_at > now - self.older_than:
            return False
        if self.lapsed and not (
            record.state is State.IN_PROGRESS
            and (record.lease_until is None or record.lease_until <= now)
        ):
            return False
        if self.key_prefix is not None and not record.key.startswith(self.key_prefix):
            return False
        if self.error_contains is not None and (
            record.error is None
            or ascii_lower(self.error_contains) not in ascii_lower(record.error)
        ):
            return False
        return self.after is None or (record.scope, record.key) > self.after


def ascii_lower(text: str) -> str:
    """``text`` with ASCII letters lowered, others kept (SQLite's ``lower()``, so every
    store folds the case of an error search alike)."""
    return text.translate(_ASCII_LOWER)


_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


@dataclass(frozen=True)
class PurgeRule:
    """Which records retention deletes (see the module docstring).

    Attributes:
        older_than: seconds past expiry (completed) or past the last write (failed and
            dead, with ``include_dead``) before a record is deleted.
        include_dead: also delete ``failed`` and ``dead`` records.
        scope: only this scope.
    """

    older_than: float = 0.0
    include_dead: bool = False
    scope: str | None = None

    def __post_init__(self) -> None:
        if not self.older_than >= 0:
            raise ConfigurationError("older_than must be a non-negative number of seconds")


def purge_qualifies(record: Record, now: float, rule: PurgeRule) -> bool:
    """Whether retention deletes ``record`` at ``now`` under ``rule``."""
    if rule.scope is not None and record.scope != rule.scope:
        return False
    cutoff = now - rule.older_than
    if record.state is State.COMPLETED:
        return record.expires_at is not None and record.expires_at <= cutoff
    if record.state in (State.FAILED, State.DEAD):
        return rule.include_dead and record.updated_at <= cutoff
    return False


def reap_decision(record: Record, now: float, token: int) -> tuple[Expect, Write] | None:
    """The fenced write that reaps ``record`` (``None``: it does not qualify at ``now``)."""
    if record.state is not State.IN_PROGRESS:
        return None
    if record.lease_until is not None and record.lease_until > now:
        return None
    write = Write(
        state=State.FAILED,
        token=token,
        fingerprint=record.fingerprint,
        attempts=record.attempts + 1,  # the lapsed run is a failed attempt (see above)
        error=record.error or LAPSED_ERROR,
        payload=record.payload,
        checkpoint=record.checkpoint,
        # as a takeover does: the checkpoint the row holds when the write lands (a lapsed
        # holder may have saved a newer one after this read, then lapsed again)
        keep_checkpoint=True,
    )
    return Expect(record.token, State.IN_PROGRESS, lapsed=True), write


def redrive_decision(record: Record, token: int) -> tuple[Expect, Write] | None:
    """The fenced redrive of ``record`` (``None``: only dead and failed are redriven)."""
    if record.state not in (State.DEAD, State.FAILED):
        return None
    return Expect(record.token, record.state), redrive_write(record, token)


@dataclass(frozen=True)
class ScopeStats:
    """What a store holds for one scope.

    Attributes:
        scope: the scope.
        counts: records by state (every state present, zero when none).
        oldest_in_progress: seconds since the oldest ``in_progress`` record's key was
            first claimed (its ``created_at``, kept across retries; ``None``: none).
        expired: completed records past ``expires_at`` not purged yet.
        claims: deliveries counted in the stats window that ran or replayed (from
            :class:`onceonly.admin._admin.DuplicateCounter`, when one is installed).
        replays: those that replayed a stored result.
    """

    scope: str
    counts: dict[State, int] = field(default_factory=dict)
    oldest_in_progress: float | None = None
    expired: int = 0
    claims: int = 0
    replays: int = 0

    @property
    def duplicate_rate(self) -> float | None:
        """``replays / claims`` over the window (``None``: nothing counted)."""
        return self.replays / self.claims if self.claims else None

    @property
    def total(self) -> int:
        """Records of the scope in every state."""
        return sum(self.counts.values())
