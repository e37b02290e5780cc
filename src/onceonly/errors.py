# SPDX-License-Identifier: MIT
"""Every exception onceonly raises.

The tree is organised by what the caller does next::

    OnceOnlyError
    ├── InvalidKey            (ValueError)   fix the key; nothing was stored
    │   └── MissingMessageId                 a broker message with no id and no fallback
    ├── PayloadMismatch       (ValueError)   same key, other payload: a client bug, never a replay
    ├── TooLarge              (ValueError)   payload or result past the configured limit
    ├── EncodingError         (TypeError)    a result that cannot be encoded as JSON
    │   └── InvalidPayload                   a payload without a canonical form: fix the producer
    ├── ConfigurationError    (ValueError)   bad URL, table name, option or missing extra
    │   ├── InvalidPrincipal                 an HTTP principal callable returned "" or "None"
    │   ├── NotMigrated                      no tables yet: run store.migrate() (a StoreError too)
    │   ├── StoreMisconfigured               no such database, login refused (StoreUnavailable too)
    │   └── UnsupportedEngine                open_store(engine): an engine no store works on
    ├── InFlight                             a live claim elsewhere: retry later / nack / 409
    ├── DeadLettered                         max_attempts reached: dead-letter it
    ├── LeaseLost                            your claim was taken over: discard your result
    ├── OutcomeNotRecorded                   the effect ran, its result is not stored: reconcile
    ├── ReplayedError                        a cached error whose class could not be rebuilt
    ├── PublishError                         the broker refused a message (permanent)
    │   └── BrokerUnavailable                transient: unreachable, connection lost, timeout
    ├── TransactionError                     the handler broke the inbox's transaction: fix it
    │   ├── TransactionEnded                 it committed or rolled back tx.connection itself
    │   └── TransactionAborted               a statement failed and the handler went on
    └── StoreError                           the store failed
        ├── StoreUnavailable                 transient (connection lost, busy): retry the delivery
        └── CorruptRecord                    a row the library does not understand (unknown state)

A duplicate that replays is *not* an error: it is an ``Outcome`` with
``replayed=True``.
"""

from __future__ import annotations

__all__ = [
    "BrokerUnavailable",
    "ConfigurationError",
    "CorruptRecord",
    "DeadLettered",
    "EncodingError",
    "InFlight",
    "InvalidKey",
    "InvalidPayload",
    "InvalidPrincipal",
    "LeaseLost",
    "MissingMessageId",
    "NotMigrated",
    "OnceOnlyError",
    "OutcomeNotRecorded",
    "PayloadMismatch",
    "PublishError",
    "ReplayedError",
    "StoreError",
    "StoreMisconfigured",
    "StoreUnavailable",
    "TooLarge",
    "TransactionAborted",
    "TransactionEnded",
    "TransactionError",
    "UnsupportedEngine",
]


class OnceOnlyError(Exception):
    """Root of every onceonly error.

    Attributes:
        key: the idempotency key involved, when there is one.
        scope: the scope (consumer, function) involved, when there is one.
        status_hint: the HTTP status an API would answer with.
    """

    status_hint: int = 500

    def __init__(self, message: str, *, key: str | None = None, scope: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.key = key
        self.scope = scope


class InvalidKey(OnceOnlyError, ValueError):
    """The key is not a 1..255 character string without control characters.

    Fix the producer of the key; nothing was written.
    """

    status_hint = 400


class MissingMessageId(InvalidKey):
    """A broker message carries no id (field or header) and no fallback was configured.

    Configure ``message_id=`` on the consumer (a payload field or a content hash), or
    make the producer set one. The consumer dead-letters such a message.
    """


class PayloadMismatch(OnceOnlyError, ValueError):
    """The key was already used with another payload.

    This is a client bug (a reused key), never a replay: answer 422 or route the
    message to a dead-letter destination. The stored record is untouched.
    """

    status_hint = 422


class TooLarge(OnceOnlyError, ValueError):
    """A payload or result is larger than the configured limit.

    Raise the limit (``max_result_bytes``) or store less. Nothing was written.
    """

    status_hint = 413


class EncodingError(OnceOnlyError, TypeError):
    """A result could not be encoded as JSON (dataclasses and JSON types are supported)."""


class InvalidPayload(EncodingError):
    """A payload cannot be fingerprinted: NaN or infinities, lone surrogates, nesting past
    the depth limit, a circular structure, numbers past the digit limit (docs/spec.md
    §2.2.2).

    The message can never be processed as it is: dead-letter it (a broker consumer does)
    or answer 400, and fix its producer. Nothing was written.
    """

    status_hint = 400


class ConfigurationError(OnceOnlyError, ValueError):
    """A store URL, table name, option or missing optional dependency is wrong."""


class InvalidPrincipal(ConfigurationError):
    """An HTTP ``principal=`` callable returned something that names no client: empty
    text, the text ``"None"`` (``str(request.user.pk)`` for an anonymous visitor), a
    bool or another type than ``str``/``int``/``UUID``.

    Such a value would put every anonymous client in one scope, so one would be replayed
    another's response. Return ``None`` for an unknown client (the request is then
    refused with 403, or runs unprotected with ``HttpPolicy(anonymous="pass")``), e.g.
    with ``onceonly.contrib.django.principals.user_principal``. Raised when the request
    arrives (the server answers 500); nothing was stored.

    .. versionadded:: 0.3
    """


class UnsupportedEngine(ConfigurationError):
    """``open_store(engine)`` was given something other than a SQLAlchemy ``Engine``
    (``AsyncEngine`` for ``open_async_store``), or an engine whose dialect and driver no
    store works on (the message lists those that do).

    .. versionadded:: 0.3
    """


class InFlight(OnceOnlyError):
    """Another worker holds a live claim on this key.

    Negatively acknowledge the message (or answer 409) and let it come back later.

    Attributes:
        retry_after: seconds until the holder's lease runs out, when known.
    """

    status_hint = 409

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        scope: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, key=key, scope=scope)
        self.retry_after = retry_after


class DeadLettered(OnceOnlyError):
    """The key has failed ``max_attempts`` times and is parked as ``dead``.

    Route the message to a dead-letter destination and acknowledge it; an operator
    can redrive it later.

    Attributes:
        attempts: how many attempts failed.
        error: the last error summary.
    """

    status_hint = 422

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        scope: str | None = None,
        attempts: int = 0,
        error: str | None = None,
    ) -> None:
        super().__init__(message, key=key, scope=scope)
        self.attempts = attempts
        self.error = error


class LeaseLost(OnceOnlyError):
    """The lease lapsed and another worker took the claim over (fencing token changed).

    Your result was discarded; the other worker's result stands. Do not acknowledge
    as if you had completed.
    """

    status_hint = 409


class OutcomeNotRecorded(OnceOnlyError):
    """The function ran (its effect happened) but its outcome could not be stored.

    Leased mode retries the final write while the claim is still its own (renewing the
    lease, within ``final_write_budget`` when one is set); this is raised when the store
    stayed unreachable for all of it. It is **not** :class:`StoreUnavailable` ("nothing
    happened, retry"): a blind retry would run the effect again once the lease lapses.
    Reconcile instead (look the effect up downstream by ``key``), or retry knowing the
    downstream call is itself idempotent on ``key``.

    Attributes:
        result: the value the function returned (``None`` for a failure).

    .. versionadded:: 0.4
    """

    status_hint = 500

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        scope: str | None = None,
        result: object = None,
    ) -> None:
        super().__init__(message, key=key, scope=scope)
        self.result = result


class ReplayedError(OnceOnlyError):
    """A cached error (``cache_errors=``) replayed to a duplicate.

    Raised when the stored exception's class is no longer among ``cache_errors``;
    the message carries the original error summary.
    """

    status_hint = 422


class PublishError(OnceOnlyError):
    """A broker refused or could not route a published message (no queue or stream takes
    it, the payload is too large, a nack).

    Permanent for this message: the relay retries it with backoff and counts each
    failure; after ``max_attempts`` the row is ``dead``, kept for an operator to fix the
    cause and redrive it. The transient kind is :class:`BrokerUnavailable`.
    """

    status_hint = 502


class BrokerUnavailable(PublishError):
    """The broker could not be reached, dropped the connection, or did not answer in time.

    Transient: the message was not refused. The relay postpones the row with backoff and
    never counts this against ``max_attempts``, however long the outage; at start-up it
    means the broker URL, credentials or host are wrong or the broker is down.

    .. versionadded:: 0.2
    """


class TransactionError(OnceOnlyError):
    """The handler broke the transaction that holds its claim (atomic mode).

    Nothing is reported as done: the attempt counts as failed and the message is retried
    (dead-lettered at ``max_attempts``). Fix the handler: write through ``tx.execute`` or
    ``tx.connection`` and leave commit and rollback to the inbox.
    """


class TransactionEnded(TransactionError):
    """The handler committed or rolled back ``tx.connection`` itself (``with conn:`` on
    sqlite3, ``conn.commit()``, ``conn.rollback()``), so the claim no longer shares a
    transaction with the handler's writes.

    Never commit inside a handler; to undo part of the work, use a savepoint
    (``conn.transaction()`` on psycopg, ``SAVEPOINT`` on SQLite).
    """


class TransactionAborted(TransactionError):
    """A statement failed inside the transaction and the handler carried on (it caught a
    database error), so the transaction can only roll back.

    Let database errors propagate, or wrap the statement that may fail in a savepoint.
    """


class StoreError(OnceOnlyError):
    """The store failed. The delivery should be retried; committed records are intact."""

    status_hint = 503


class NotMigrated(ConfigurationError, StoreError):
    """The store's tables do not exist yet (or not in this database / schema).

    Both a :class:`ConfigurationError` (what to fix) and a :class:`StoreError` (where
    it surfaced: code that catches store failures keeps working).

    Run ``store.migrate()`` once (or open the store with ``migrate=True``, or run
    ``onceonly migrate --url …``) before using it. Broker consumers retry a delivery that
    meets this error without counting it, so no message is dead-lettered while a
    deployment waits for its migration.

    .. versionadded:: 0.2
    """


class StoreUnavailable(StoreError):
    """A transient store failure: connection lost, database busy, timeout. Retry."""


class StoreMisconfigured(ConfigurationError, StoreUnavailable):
    """The database server answered and refused this configuration: the database named
    in the URL does not exist, or the login was refused (unknown user, wrong password,
    no ``pg_hba.conf`` entry, no access to that database).

    Fix the URL or the credentials, or create the database: retrying the same
    configuration does not help, so the command line exits 2, not 3. It is also a
    :class:`StoreUnavailable` (where it surfaced, as :class:`NotMigrated` is a
    :class:`StoreError`): broker consumers and the relay wait for the fix with backoff,
    counting no attempt, so no message is dead-lettered while a deployment's database is
    being created or its credentials rotated.

    .. versionadded:: 0.3
    """


class CorruptRecord(StoreError):
    """A record in the table cannot be understood (an unknown state, undecodable data).

    Inspect the row; onceonly will not guess and will not overwrite it.
    """
