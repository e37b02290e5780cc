# SPDX-License-Identifier: MIT
"""The inbox's rules around a handler run, shared by ``Inbox`` and ``AsyncInbox``
(docs/spec.md §1.3): what a failure carries out of the transaction, whether the
handler left the transaction usable, and the errors a run ends with. No I/O."""

from __future__ import annotations

from onceonly._core.state import Expect, Record, State
from onceonly.errors import (
    ConfigurationError,
    CorruptRecord,
    DeadLettered,
    PayloadMismatch,
    StoreError,
    StoreUnavailable,
    TransactionAborted,
    TransactionEnded,
    TransactionError,
)
from onceonly.types import TxHealth

__all__ = [
    "HandlerFailed",
    "check_health",
    "commit_refused",
    "dead_error",
    "ended",
    "is_own_mark",
    "mismatch_error",
]


class HandlerFailed(Exception):
    """Carries a handler's exception out of the transaction so it rolls back first.

    ``seen``: the version the claim was decided from (``None``: the claim inserted).
    ``transient``: the store went away (connection lost), so the attempt is not counted.
    """

    def __init__(
        self,
        exc: BaseException,
        claimed: Record,
        seen: Expect | None,
        attempt: int,
        health: TxHealth,
    ) -> None:
        super().__init__(repr(exc))
        self.exc = exc
        self.claimed = claimed
        self.seen = seen
        self.attempt = attempt
        self.transient = health is TxHealth.LOST or isinstance(exc, StoreUnavailable)
        #: the handler ended the transaction (its claim may have committed on its own)
        self.ended = health is TxHealth.ENDED or isinstance(exc, TransactionEnded)


def commit_refused(exc: BaseException) -> bool:
    """Whether ``exc``, raised by the COMMIT of a transaction whose handler succeeded,
    is the database refusing the handler's writes (a deferred constraint, a trigger at
    commit) or the transaction found ended there (its savepoint gone): a failed
    attempt. Not a lost connection (the commit may have happened: retried uncounted),
    a missing table or a damaged record."""
    if isinstance(exc, TransactionError):
        return True
    return isinstance(exc, StoreError) and not isinstance(
        exc, (StoreUnavailable, ConfigurationError, CorruptRecord)
    )


def ended(scope: str, key: str) -> TransactionEnded:
    """The error of a handler that ended the inbox's transaction (spec §1.3)."""
    return TransactionEnded(
        "the handler committed or rolled back the inbox's transaction; leave commit "
        "and rollback to the inbox (use a savepoint to undo part of the work)",
        key=key,
        scope=scope,
    )


def check_health(health: TxHealth, scope: str, key: str) -> None:
    """Refuse to complete a claim whose transaction the handler ended or broke."""
    if health is TxHealth.ENDED:
        raise ended(scope, key)
    if health is TxHealth.ABORTED:
        raise TransactionAborted(
            "a statement failed in the handler's transaction and the handler carried on; "
            "let database errors propagate, or wrap the statement in a savepoint",
            key=key,
            scope=scope,
        )
    if health is TxHealth.LOST:
        raise StoreUnavailable(
            "the connection was lost while the handler ran", key=key, scope=scope
        )


def is_own_mark(record: Record | None, own: int) -> bool:
    """Whether ``record`` is the precount mark this delivery wrote."""
    return record is not None and record.token == own and record.state is State.FAILED


def dead_error(record: Record, attempts: int | None) -> DeadLettered:
    """The error of a dead key (``attempts``: as stored now, else the record's)."""
    n = attempts if attempts is not None else record.attempts
    return DeadLettered(
        f"this key failed {n} times and is dead-lettered: {record.error}",
        key=record.key,
        scope=record.scope,
        attempts=n,
        error=record.error,
    )


def mismatch_error(key: str, scope: str) -> PayloadMismatch:
    """The error of a key reused with another payload (spec §2.3): never a replay."""
    return PayloadMismatch(
        "this key was already used with another payload (other arguments, another "
        "request); a reused key is never replayed: give each new request its own key",
        key=key,
        scope=scope,
    )
