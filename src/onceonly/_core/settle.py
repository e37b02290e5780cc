# SPDX-License-Identifier: MIT
"""How a broker consumer settles one delivery: the verdict table (pure: no I/O, no clock).

Every delivery ends in one of three actions (DESIGN §2, "every delivery is settled"):

* ``ACK`` — done: processed, replayed, or completed with a cached error;
* ``RETRY`` — try again after ``delay`` seconds. A *counted* retry goes back to the
  broker, whose delivery count grows toward ``max_deliveries``; an *uncounted* one
  (the store is unavailable, a concurrent duplicate is in flight) is retried by the
  consumer while it keeps the message, so the broker's count does not move and the
  inbox's attempts are not consumed;
* ``DEAD_LETTER`` — publish to the dead-letter destination with ``reason`` and
  ``error``, then ack. Never a silent drop.

:func:`admit` runs before anything else, on the broker's delivery count alone:

======================================  ==========================================
delivery_count > max_deliveries         DEAD_LETTER ``max-deliveries`` (no decoding,
                                        no handler: the message may be what kills
                                        the worker)
otherwise, or no count (classic queue)  ``None``: process it
======================================  ==========================================

:func:`verdict` then maps where processing stopped (the :class:`Stage`) and the
exception (``None``: success) to an action. The first matching row wins:

=========  ==========================================  ==================================
stage      exception                                   verdict
=========  ==========================================  ==================================
any        ``None``                                    ACK
DECODE     any                                         DEAD_LETTER ``undecodable``
KEY        any                                         DEAD_LETTER ``invalid-id``
any        ``LeaseLost`` (leased mode: taken over)     RETRY counted (``lease-lost``),
                                                       never a dead letter
HANDLER    one of ``cache_errors``                     ACK ``cached-error``
HANDLER    any other                                   RETRY counted (``handler-error``)
INBOX      ``ReplayedError``, one of ``cache_errors``  ACK ``cached-error``
INBOX      ``InFlight``                                RETRY uncounted (``in-flight``)
INBOX      ``StoreUnavailable``                        RETRY uncounted (``store-unavailable``)
INBOX      ``NotMigrated`` (the store has no tables)   RETRY uncounted (``not-migrated``)
INBOX      ``DeadLettered``                            DEAD_LETTER ``dead-lettered``
INBOX      ``PayloadMismatch``                         DEAD_LETTER ``payload-mismatch``
INBOX      ``InvalidKey`` (``MissingMessageId``)       DEAD_LETTER ``invalid-id``
INBOX      ``TooLarge``                                DEAD_LETTER ``too-large``
INBOX      ``InvalidPayload`` (no canonical form)      DEAD_LETTER ``undecodable``
INBOX      ``EncodingError`` (the result)              DEAD_LETTER ``unencodable``
INBOX      ``RecursionError`` (a payload nested too    DEAD_LETTER ``undecodable``
           deep to fingerprint)
INBOX      other ``StoreError``                        RETRY counted (``store-error``)
INBOX      anything else                               RETRY counted (``error``)
=========  ==========================================  ==================================

``HANDLER`` means the handler itself raised the exception; ``INBOX`` is everything
``Inbox.process`` raised otherwise (its claim, fingerprint, result encoding, replay).
A counted RETRY on the ``max_deliveries``-th delivery becomes DEAD_LETTER
``max-deliveries`` at once: the next delivery would be dead-lettered unrun anyway. Not
``lease-lost``: another worker holds the key and settles it, so this delivery is handed
back, never acked (a dead letter is acked).

Delays come from :func:`~onceonly._core.backoff.backoff_delay` with the caller's jitter:
a counted retry backs off on the broker's delivery count, an uncounted one on how many
uncounted retries this delivery has had; ``InFlight.retry_after`` is honoured up to the
cap.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from onceonly._core.backoff import backoff_delay
from onceonly.errors import (
    DeadLettered,
    EncodingError,
    InFlight,
    InvalidKey,
    InvalidPayload,
    LeaseLost,
    NotMigrated,
    PayloadMismatch,
    ReplayedError,
    StoreError,
    StoreUnavailable,
    TooLarge,
)

__all__ = [
    "MAX_ERROR_CHARS",
    "Action",
    "Backoff",
    "Stage",
    "Verdict",
    "admit",
    "describe",
    "header_text",
    "still_suspect",
    "verdict",
]

#: The longest error text a dead letter carries (characters).
MAX_ERROR_CHARS = 1000

# Reasons a dead letter carries in its onceonly-dead-reason header.
MAX_DELIVERIES = "max-deliveries"
#: An uncounted retry: the store has no tables yet (run ``store.migrate()``).
NOT_MIGRATED = "not-migrated"
UNDECODABLE = "undecodable"
INVALID_ID = "invalid-id"
DEAD_LETTERED = "dead-lettered"
PAYLOAD_MISMATCH = "payload-mismatch"
TOO_LARGE = "too-large"
UNENCODABLE = "unencodable"
#: A counted retry that is never a dead letter: leased mode, another worker took over.
LEASE_LOST = "lease-lost"


class Action(str, enum.Enum):
    """What the consumer does with the delivery."""

    ACK = "ack"
    RETRY = "retry"
    DEAD_LETTER = "dead-letter"


class Stage(enum.Enum):
    """Where the processing of a delivery stopped."""

    DECODE = "decode"  # turning the body into a payload
    KEY = "key"  # finding the message id (broker id or fallback)
    INBOX = "inbox"  # Inbox.process, outside the handler
    HANDLER = "handler"  # the handler raised it


@dataclass(frozen=True)
class Backoff:
    """Retry delays: ``base * 2 ** (n - 1)`` capped at ``cap``, jittered by half."""

    base: float = 0.1
    cap: float = 5.0

    def delay(self, attempt: int, jitter: float) -> float:
        """The delay before retry number ``attempt`` (1 = the first)."""
        return backoff_delay(max(attempt, 1), base=self.base, cap=self.cap, jitter=jitter)


@dataclass(frozen=True)
class Verdict:
    """How to settle one delivery.

    Attributes:
        action: ack, retry or dead-letter.
        reason: why (a dead letter's ``onceonly-dead-reason``; for a retry, a log word).
        error: the error text, already made safe for a header (:func:`header_text`).
        attempts: the inbox's failed attempts, when the exception says.
        delay: seconds to wait before the retry.
        counted: a retry that goes back to the broker (its delivery count grows);
            ``False`` for transient errors, which the consumer retries while it keeps
            the message.
    """

    action: Action
    reason: str | None = None
    error: str | None = None
    attempts: int | None = None
    delay: float = 0.0
    counted: bool = True


ACK = Verdict(Action.ACK)


def header_text(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` as a header value: one line, no NUL or other control characters, no lone
    surrogates, at most ``limit`` characters (the last one ``…`` when cut).

    Brokers reject or mangle the rest: AMQP and NATS headers are UTF-8 (a lone surrogate
    cannot be encoded), a CR or LF ends a NATS header line, and many clients stop at NUL.
    """
    out: list[str] = []
    for ch in text[: limit + 1]:
        code = ord(ch)
        if code < 0x20 or 0x7F <= code <= 0x9F:
            out.append(" ")
        elif 0xD800 <= code <= 0xDFFF:
            out.append("\ufffd")
        else:
            out.append(ch)
    if len(out) > limit:
        out[limit - 1 :] = ["…"] if limit > 0 else []
    return "".join(out)


def describe(exc: BaseException, limit: int = MAX_ERROR_CHARS) -> str:
    """``"Type: message"`` for a header (a dead key's stored error summary for
    :class:`~onceonly.DeadLettered`); never raises, even when ``str(exc)`` does."""
    if isinstance(exc, DeadLettered) and exc.error:
        return header_text(exc.error, limit)
    name = type(exc).__qualname__
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable>"
    return header_text(f"{name}: {message}" if message else name, limit)


def admit(delivery_count: int | None, max_deliveries: int) -> Verdict | None:
    """``None`` to process the delivery; a DEAD_LETTER verdict when the broker has
    delivered it more than ``max_deliveries`` times (see the module table)."""
    if delivery_count is not None and delivery_count > max_deliveries:
        return Verdict(
            Action.DEAD_LETTER,
            MAX_DELIVERIES,
            header_text(
                f"delivered {delivery_count} times (max_deliveries={max_deliveries}) "
                "without being settled; the handler was not run again"
            ),
        )
    return None


def still_suspect(attempts: int | None, max_deliveries: int) -> bool:
    """Whether a delivery :func:`admit` refused may still run, by the attempts the store
    counted for its key (``None``: no record).

    The broker counts every delivery a dead worker held, so a message redelivered with
    the poison one is counted for the poison's crashes. A redelivered message runs
    alone, each of its attempts counted in the store before it runs; the first crash of
    a message (as a fresh delivery) is counted by the broker only. So a message has
    killed a worker ``max_deliveries`` times when the store counted ``max_deliveries -
    1`` of its attempts: short of that, it runs again (alone, counted).
    """
    return (attempts or 0) < max_deliveries - 1


def _dead(reason: str, exc: BaseException) -> Verdict:
    attempts = exc.attempts if isinstance(exc, DeadLettered) else None
    return Verdict(Action.DEAD_LETTER, reason, describe(exc), attempts)


def verdict(
    exc: BaseException | None,
    *,
    stage: Stage,
    delivery_count: int | None,
    max_deliveries: int,
    backoff: Backoff,
    jitter: float,
    cache_errors: tuple[type[BaseException], ...] = (),
    uncounted_retries: int = 0,
) -> Verdict:
    """The verdict for a delivery whose processing stopped at ``stage`` with ``exc``.

    Args:
        exc: what was raised, or ``None`` when the inbox returned an outcome.
        stage: where it was raised.
        delivery_count: the broker's count for this delivery (1 = first), if it has one.
        max_deliveries: the most deliveries before the message is dead-lettered unrun.
        backoff: the consumer's delays.
        jitter: a number in ``[0, 1)`` (the caller's randomness).
        cache_errors: the inbox's ``cache_errors``.
        uncounted_retries: uncounted retries this delivery has had so far.

    Returns:
        The :class:`Verdict` of the module table.
    """
    if exc is None:
        return ACK
    if stage is Stage.DECODE:
        return _dead(UNDECODABLE, exc)
    if stage is Stage.KEY:
        return _dead(INVALID_ID, exc)
    if isinstance(exc, LeaseLost):
        delay = backoff.delay(delivery_count or 1, jitter)
        return Verdict(Action.RETRY, LEASE_LOST, describe(exc), delay=delay, counted=True)
    if stage is Stage.HANDLER:
        if cache_errors and isinstance(exc, cache_errors):
            return Verdict(Action.ACK, "cached-error", describe(exc))
        return _counted("handler-error", exc, delivery_count, max_deliveries, backoff, jitter)
    if isinstance(exc, ReplayedError) or (cache_errors and isinstance(exc, cache_errors)):
        return Verdict(Action.ACK, "cached-error", describe(exc))
    if isinstance(exc, (InFlight, StoreUnavailable, NotMigrated)):
        # not the message's fault: a concurrent duplicate, a store that went away, or a
        # deployment whose migration has not run yet; nothing is dead-lettered meanwhile
        delay = backoff.delay(uncounted_retries + 1, jitter)
        retry_after = exc.retry_after if isinstance(exc, InFlight) else None
        if retry_after is not None:
            delay = min(max(delay, retry_after), backoff.cap)
        if isinstance(exc, InFlight):
            reason = "in-flight"
        elif isinstance(exc, NotMigrated):
            reason = NOT_MIGRATED
        else:
            reason = "store-unavailable"
        return Verdict(Action.RETRY, reason, describe(exc), delay=delay, counted=False)
    for kind, reason in _DEAD_ERRORS:
        if isinstance(exc, kind):
            return _dead(reason, exc)
    reason = "store-error" if isinstance(exc, StoreError) else "error"
    return _counted(reason, exc, delivery_count, max_deliveries, backoff, jitter)


_DEAD_ERRORS: tuple[tuple[type[BaseException], str], ...] = (
    (DeadLettered, DEAD_LETTERED),
    (PayloadMismatch, PAYLOAD_MISMATCH),
    (InvalidKey, INVALID_ID),
    (TooLarge, TOO_LARGE),
    (InvalidPayload, UNDECODABLE),
    (EncodingError, UNENCODABLE),
    (RecursionError, UNDECODABLE),
)


def _counted(
    reason: str,
    exc: BaseException,
    delivery_count: int | None,
    max_deliveries: int,
    backoff: Backoff,
    jitter: float,
) -> Verdict:
    if delivery_count is not None and delivery_count >= max_deliveries:
        return Verdict(Action.DEAD_LETTER, MAX_DELIVERIES, describe(exc))
    delay = backoff.delay(delivery_count or 1, jitter)
    return Verdict(Action.RETRY, reason, describe(exc), delay=delay, counted=True)
