# SPDX-License-Identifier: MIT
"""What every broker consumer shares: message ids, decoding, and processing one delivery.

A consumer hands each delivery to :meth:`Deliveries.process`, which returns a
:class:`Settlement`; the consumer then settles the delivery with its broker by the
settlement's :class:`~onceonly._core.settle.Verdict` (the table is in
:mod:`onceonly._core.settle`, the same for every broker):

* ``ACK`` — processed, replayed, or completed with a cached error: acknowledge. Only
  after the inbox's commit.
* ``RETRY`` — the handler failed (or something unexpected did): hand the message back
  to the broker after ``delay`` (nack / nak / fetch again), which counts the delivery.
  A transient error (``StoreUnavailable``, ``InFlight``) is retried here instead, with
  backoff, while the consumer keeps the message: the broker's delivery count does not
  move and the inbox's attempts are not consumed. Such a ``RETRY`` reaches the
  consumer only when it is stopping (hand the message back at once).
* ``DEAD_LETTER`` — publish to the dead-letter destination with the reason and the
  error, then ack. Never a silent drop.

Nothing a delivery raises escapes unsettled: a body that cannot be decoded (a JSON
document nested too deep raises ``RecursionError``) or a message id that cannot be
found is dead-lettered; a handler's exception is retried and counted.

A message the broker has delivered more than ``max_deliveries`` times is
dead-lettered without being decoded or handled. This is what ends a poison message
that kills the worker: in atomic mode such a crash commits nothing, so the inbox's
attempts never move, but the broker's count does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from onceonly._core import window
from onceonly._core.keys import content_key, validate_key
from onceonly._core.settle import (
    ACK,
    NOT_MIGRATED,
    Action,
    Backoff,
    Stage,
    Verdict,
    admit,
    header_text,
    verdict,
)
from onceonly.errors import ConfigurationError, InvalidKey, MissingMessageId, StoreUnavailable
from onceonly.inbox_async import AsyncInbox, AsyncTx
from onceonly.messaging import Delivery
from onceonly.outcome import Outcome

__all__ = [
    "DELIVERY_MARGIN",
    "Deliveries",
    "Handler",
    "InFlightTracker",
    "MessageIds",
    "Settlement",
    "decode_body",
    "default_max_deliveries",
    "pause",
    "unexpected",
]

log = logging.getLogger("onceonly.brokers")

Handler = Callable[[Any, AsyncTx], Awaitable[Any]]

#: Deliveries allowed beyond the inbox's ``max_attempts`` by default: one to learn
#: that the key is dead, the rest for deliveries that end without a verdict (a crash,
#: a stop past ``shutdown_timeout``, a lost connection).
DELIVERY_MARGIN = 5


class MessageIds:
    """Where a consumer takes a message's id from.

    The broker's own id (RabbitMQ ``message_id``, the ``Nats-Msg-Id`` header, the
    stream entry's id field) comes first. Without it, ``fallback`` decides:

    * ``None`` — no fallback: :class:`~onceonly.MissingMessageId` (the message is
      dead-lettered with reason ``invalid-id``);
    * ``"content"`` — the SHA-256 of the canonical payload (identical payloads are one
      message);
    * a ``str`` naming a top-level payload field, e.g. ``"event_id"``;
    * a callable ``payload -> str``.
    """

    def __init__(self, fallback: str | Callable[[Any], str] | None = None) -> None:
        self.fallback = fallback

    def resolve(self, broker_id: str | None, payload: Any) -> str:
        """The message id; raises InvalidKey / MissingMessageId when there is none."""
        if broker_id:
            return _valid(broker_id)
        fb = self.fallback
        if fb is None:
            raise MissingMessageId(
                "the message has no id (no broker message id or header) and the consumer "
                "has no fallback; set message_id='content', a payload field, or a callable"
            )
        if fb == "content":
            return content_key(payload)
        if isinstance(fb, str):
            value = payload.get(fb) if isinstance(payload, dict) else None
            if value is None:
                raise MissingMessageId(
                    f"the message has no broker id and no {fb!r} field in its payload"
                )
            return _valid(str(value))
        return _valid(fb(payload))


def _valid(message_id: object) -> str:
    key = validate_key(message_id, what="message id")
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in key):
        raise InvalidKey("message id contains a lone surrogate (it is not valid UTF-8)")
    return key


def decode_body(body: bytes) -> Any:
    """JSON bodies decode to their value; anything else stays bytes.

    A JSON document nested too deep for the decoder raises ``RecursionError``: the
    consumer dead-letters it as ``undecodable`` (keeping it as bytes would only fail
    later, when the inbox fingerprints it).
    """
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return bytes(body)


def default_max_deliveries(inbox: AsyncInbox) -> int:
    """The inbox's ``max_attempts`` plus :data:`DELIVERY_MARGIN`."""
    policy = getattr(inbox, "policy", None)
    attempts = getattr(policy, "max_attempts", None)
    return (attempts if isinstance(attempts, int) else 5) + DELIVERY_MARGIN


async def pause(stop: asyncio.Event | None, delay: float) -> bool:
    """Sleep ``delay`` seconds unless ``stop`` is set first; return whether it is set."""
    if stop is None:
        await asyncio.sleep(delay)
        return False
    if stop.is_set():
        return True
    try:
        await asyncio.wait_for(stop.wait(), max(delay, 0.0))
    except asyncio.TimeoutError:  # a distinct class on 3.10
        return False
    return True


@dataclass(frozen=True)
class Settlement:
    """How to settle one delivery, with what the dead letter and the logs need.

    Attributes:
        verdict: the action, reason, error text and delay.
        message_id: the message id, once known (for a dead letter before decoding, the
            broker's id if it is a valid key).
        outcome: the inbox's outcome, on ACK after processing.
    """

    verdict: Verdict
    message_id: str | None = None
    outcome: Outcome[Any] | None = None

    @property
    def action(self) -> Action:
        return self.verdict.action

    @property
    def replayed(self) -> bool:
        return self.outcome is not None and self.outcome.replayed


class Deliveries:
    """Processes deliveries through an inbox and says how to settle each (shared by
    every consumer).

    Args:
        inbox: the consumer's inbox.
        handler: ``async handler(payload, tx)``.
        ids: the message-id policy.
        max_deliveries: the most deliveries of one message; ``None``: the inbox's
            ``max_attempts`` + :data:`DELIVERY_MARGIN`.
        backoff: retry delays.
        logger: the consumer's logger.
        dedup_window: at start, when the consumer can read the broker's redelivery
            horizon and the inbox's ttl is shorter: ``"warn"`` (log a warning),
            ``"refuse"`` (raise :class:`ConfigurationError`) or ``"off"``
            (:mod:`onceonly._core.window`).
    """

    def __init__(
        self,
        inbox: AsyncInbox,
        handler: Handler,
        ids: MessageIds,
        *,
        max_deliveries: int | None,
        backoff: Backoff,
        logger: logging.Logger,
        dedup_window: str = "warn",
    ) -> None:
        self.dedup_window = window.check_policy(dedup_window)
        if max_deliveries is None:
            max_deliveries = default_max_deliveries(inbox)
        if max_deliveries < 1:
            raise ConfigurationError("max_deliveries must be at least 1")
        if backoff.base < 0 or backoff.cap < 0:
            raise ConfigurationError("retry delays must not be negative")
        self.inbox = inbox
        self.handler = handler
        self.ids = ids
        self.max_deliveries = max_deliveries
        self.backoff = backoff
        self.log = logger
        self._random = random.Random()

    def jitter(self) -> float:
        return self._random.random()

    def check_window(self, bounds: list[window.Bound], where: str) -> None:
        """Hold the inbox's ttl against the broker's redelivery ``bounds`` (at start)."""
        window.enforce(self.dedup_window, self.inbox.ttl, bounds, self.log, where)

    def redeliveries_bound(self, wait: float, what: str) -> window.Bound:
        """The bound of this consumer's own poison rule: ``max_deliveries`` deliveries,
        each at most ``wait`` (or the longest backoff) after the previous one."""
        each = max(wait, self.backoff.cap)
        return window.Bound(f"max_deliveries x {what}", self.max_deliveries * each)

    def delay(self, attempt: int) -> float:
        """A jittered backoff delay for retry number ``attempt``."""
        return self.backoff.delay(attempt, self.jitter())

    def _verdict(
        self, exc: Exception, stage: Stage, count: int | None, uncounted: int = 0
    ) -> Verdict:
        return verdict(
            exc,
            stage=stage,
            delivery_count=count,
            max_deliveries=self.max_deliveries,
            backoff=self.backoff,
            jitter=self.jitter(),
            cache_errors=getattr(self.inbox, "cache_errors", ()),
            uncounted_retries=uncounted,
        )

    async def process(
        self,
        *,
        broker_id: str | None,
        decode: Callable[[], Any],
        delivery: Callable[[str], Delivery],
        delivery_count: int | None,
        stop: asyncio.Event | None,
        label: str,
    ) -> Settlement:
        """Process one delivery and say how to settle it.

        Args:
            broker_id: the id the broker carried, if any.
            decode: returns the payload from the body (its exceptions dead-letter).
            delivery: builds the :class:`Delivery` once the message id is known.
            delivery_count: the broker's count (1 = first), when it has one.
            stop: set when the consumer stops: transient retries end at once.
            label: names the delivery in log lines until its message id is known.

        Cancellation (a shutdown that cannot wait) propagates: the transaction rolls
        back and the broker redelivers.
        """
        refused = admit(delivery_count, self.max_deliveries)
        if refused is not None:
            known = None
            if broker_id:
                with contextlib.suppress(InvalidKey):
                    known = _valid(broker_id)
            return Settlement(refused, known)
        try:
            payload = decode()
        except Exception as exc:
            self.log.warning("%s: cannot decode the body: %s", label, _safe(exc))
            return Settlement(self._verdict(exc, Stage.DECODE, delivery_count))
        try:
            message_id = self.ids.resolve(broker_id, payload)
        except Exception as exc:
            return Settlement(self._verdict(exc, Stage.KEY, delivery_count))
        this = delivery(message_id)
        uncounted = 0
        raised: list[BaseException] = []  # what the handler itself raised

        async def run(body: Any, tx: AsyncTx) -> Any:
            try:
                return await self.handler(body, tx)
            except BaseException as exc:
                raised.append(exc)
                raise

        while True:
            raised.clear()
            try:
                outcome = await self.inbox.process(message_id, payload, run, delivery=this)
            except Exception as exc:
                # A handler failure counts even if the inbox then failed to record it
                # (and raised a store error instead): judge by the handler's exception.
                # But StoreUnavailable from the inbox means the store went away, also
                # under the handler (a lost connection): transient, never counted.
                failed = (
                    raised[-1]
                    if raised
                    and isinstance(raised[-1], Exception)
                    and not isinstance(exc, StoreUnavailable)
                    else None
                )
                stage = Stage.INBOX if failed is None else Stage.HANDLER
                decided = self._verdict(
                    exc if failed is None else failed, stage, delivery_count, uncounted
                )
                if decided.action is Action.RETRY and not decided.counted:
                    uncounted += 1
                    # an operator must see a missing migration; the rest is routine
                    say = self.log.warning if decided.reason == NOT_MIGRATED else self.log.info
                    say(
                        "%s: %s (%s); retrying in %.2fs without handing it back",
                        message_id,
                        decided.reason,
                        decided.error,
                        decided.delay,
                    )
                    if not await pause(stop, decided.delay):
                        continue
                elif decided.action is Action.RETRY:
                    self.log.warning(
                        "%s: %s on delivery %s: %s",
                        message_id,
                        decided.reason,
                        delivery_count,
                        decided.error,
                    )
                return Settlement(decided, message_id)
            return Settlement(ACK, message_id, outcome)


def unexpected(exc: BaseException, delay: float) -> Settlement:
    """The settlement of a delivery whose processing failed in the consumer itself."""
    return Settlement(Verdict(Action.RETRY, "error", _safe(exc), delay=delay))


def _safe(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__qualname__}: {exc}"
    except Exception:
        text = type(exc).__qualname__
    return header_text(text)


class InFlightTracker:
    """Counts running handlers so a graceful stop can wait for them."""

    def __init__(self, concurrency: int) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.semaphore = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self, timeout: float | None = None) -> None:
        """Wait for the running handlers (up to ``timeout``), then cancel the rest."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
