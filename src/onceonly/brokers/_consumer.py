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
dead-lettered without being handled, once the store has counted ``max_deliveries - 1``
attempts of its own (:meth:`Deliveries.still_suspect`). This is what ends a poison
message that kills the worker: in atomic mode such a crash commits nothing, so only the
attempt counted before a redelivered message runs (:meth:`Deliveries.run` with
``counted``) records it, and the broker's count includes the crashes of the messages
it was merely held with.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from onceonly._core import window
from onceonly._core.settle import (
    ACK,
    NOT_MIGRATED,
    Action,
    Backoff,
    Stage,
    Verdict,
    admit,
    header_text,
    still_suspect,
    verdict,
)
from onceonly.brokers._ids import MessageIds, decode_body, valid_id
from onceonly.errors import ConfigurationError, InvalidKey, StoreUnavailable
from onceonly.inbox import AsyncClaim, AsyncInbox, AsyncLeasedTx, AsyncTx, BatchItem, Outcome
from onceonly.messaging import Delivery

__all__ = [
    "DELIVERY_MARGIN",
    "BatchRunner",
    "Deliveries",
    "Handler",
    "InFlightTracker",
    "MessageIds",
    "Prepared",
    "Settlement",
    "released",
    "decode_body",
    "default_max_deliveries",
    "pause",
    "unexpected",
]

log = logging.getLogger("onceonly.brokers")

Handler = Callable[[Any, AsyncTx], Awaitable[Any]]
#: ``batch(items, handler)``: a batch's transaction in place of ``inbox.process_batch``.
BatchRunner = Callable[[list[BatchItem], Handler], Awaitable[list[Outcome[Any]]]]

#: Deliveries allowed beyond the inbox's ``max_attempts`` by default: one to learn
#: that the key is dead, the rest for deliveries that end without a verdict (a crash,
#: a stop past ``shutdown_timeout``, a lost connection).
DELIVERY_MARGIN = 5


def default_max_deliveries(inbox: AsyncInbox) -> int:
    """The inbox's ``max_attempts`` plus :data:`DELIVERY_MARGIN`."""
    return inbox.policy.max_attempts + DELIVERY_MARGIN


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
        batch: runs a batch in place of ``inbox.process_batch`` (same arguments and
            outcomes); a transport that writes its own state in the batch's transaction
            (Kafka's positions) passes it.
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
        batch: BatchRunner | None = None,
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
        self._batch = batch
        self._random = random.Random()
        self._counting = _precounting(inbox)

    def jitter(self) -> float:
        return self._random.random()

    async def process_batch(self, items: list[BatchItem], handler: Handler) -> list[Outcome[Any]]:
        """The batch's inbox transaction (``inbox.process_batch``, or ``batch``)."""
        if self._batch is not None:
            return await self._batch(items, handler)
        return await self.inbox.process_batch(items, handler)

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
            cache_errors=self.inbox.cache_errors,
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
        ready = self.prepare(broker_id, decode, delivery, delivery_count, label)
        if isinstance(ready, Settlement):
            return ready
        return await self.run(ready, stop)

    def prepare(
        self,
        broker_id: str | None,
        decode: Callable[[], Any],
        delivery: Callable[[str], Delivery],
        delivery_count: int | None,
        label: str,
        *,
        poison_rule: bool = True,
        released: Callable[[], bool] | None = None,
    ) -> Settlement | Prepared:
        """What comes before the inbox: the poison rule (:func:`admit`; ``poison_rule``
        false: not applied), decoding and the message id. A :class:`Settlement` when the
        delivery ends here (unrun). ``released``: whether the broker took the delivery
        back (:attr:`Prepared.released`)."""
        refused = admit(delivery_count, self.max_deliveries) if poison_rule else None
        if refused is not None:
            known = None
            if broker_id:
                with contextlib.suppress(InvalidKey):
                    known = valid_id(broker_id)
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
        return Prepared(message_id, payload, delivery(message_id), delivery_count, released)

    def judge(
        self,
        exc: Exception,
        by_handler: BaseException | None,
        *,
        label: str,
        count: int | None,
        uncounted: int = 0,
    ) -> Verdict:
        """The verdict for a delivery whose inbox call raised ``exc`` (``by_handler``:
        what the handler itself raised, if anything); logs the retries."""
        # A handler failure counts even if the inbox then failed to record it (and
        # raised a store error instead): judge by the handler's exception. But
        # StoreUnavailable from the inbox means the store went away, also under the
        # handler (a lost connection): transient, never counted.
        failed = (
            by_handler
            if isinstance(by_handler, Exception) and not isinstance(exc, StoreUnavailable)
            else None
        )
        stage = Stage.INBOX if failed is None else Stage.HANDLER
        decided = self._verdict(exc if failed is None else failed, stage, count, uncounted)
        if decided.action is Action.RETRY and not decided.counted:
            # an operator must see a missing migration; the rest is routine
            say = self.log.warning if decided.reason == NOT_MIGRATED else self.log.info
            say(
                "%s: %s (%s); retrying in %.2fs without handing it back",
                label,
                decided.reason,
                decided.error,
                decided.delay,
            )
        elif decided.action is Action.RETRY:
            self.log.warning(
                "%s: %s on delivery %s: %s", label, decided.reason, count, decided.error
            )
        return decided

    def recording(
        self,
        raised: dict[str, BaseException],
        held: Callable[[AsyncClaim], None] | None = None,
    ) -> Handler:
        """The handler, noting in ``raised`` (by key) what it raised itself, and handing
        ``held`` the claim of a leased-mode run before it starts."""

        async def run(body: Any, tx: AsyncTx) -> Any:
            if held is not None and isinstance(tx, AsyncLeasedTx):
                held(tx.claim)
            try:
                return await self.handler(body, tx)
            except BaseException as exc:
                raised[tx.key] = exc
                raise

        return run

    async def still_suspect(self, p: Prepared) -> bool:
        """Whether ``p``, counted past ``max_deliveries`` by the broker, may run again:
        the store counted fewer than ``max_deliveries - 1`` attempts of its own (a
        crash while it ran alone, a failure), so the broker's count holds crashes of
        other messages (:func:`~onceonly._core.settle.still_suspect`). When the store
        cannot answer, it runs: its counted attempt then waits for the store."""
        try:
            async with self.inbox.store.session() as session:
                snap = await session.get(self.inbox.consumer, p.message_id)
        except Exception as exc:
            self.log.info("%s: its attempts could not be read (%r)", p.message_id, exc)
            return True
        record = snap.record
        return still_suspect(None if record is None else record.attempts, self.max_deliveries)

    async def run(
        self,
        p: Prepared,
        stop: asyncio.Event | None,
        held: Callable[[AsyncClaim], None] | None = None,
        *,
        counted: bool = False,
    ) -> Settlement:
        """Run a prepared delivery through the inbox; transient failures (the store is
        unavailable, a duplicate in flight) are retried here, uncounted, until ``stop``.
        ``held`` gets the claim of each leased-mode run (the loop renews its lease).
        ``counted``: count the attempt in the store before it runs (atomic mode's
        ``precount_attempts``), so a crash during it counts against it alone."""
        uncounted = 0
        raised: dict[str, BaseException] = {}
        run = self.recording(raised, held)
        inbox = self._counting if counted else self.inbox
        while True:
            raised.clear()
            if p.is_released():
                return released(p, None, self.log)
            try:
                outcome = await inbox.process(p.message_id, p.payload, run, delivery=p.delivery)
            except Exception as exc:
                if p.is_released():
                    return released(p, exc, self.log)
                decided = self.judge(
                    exc,
                    raised.get(p.message_id),
                    label=p.message_id,
                    count=p.count,
                    uncounted=uncounted,
                )
                if decided.action is Action.RETRY and not decided.counted:
                    uncounted += 1
                    if not await pause(stop, decided.delay):
                        continue
                return Settlement(decided, p.message_id)
            return Settlement(ACK, p.message_id, outcome)


def _precounting(inbox: AsyncInbox) -> AsyncInbox:
    """``inbox`` with ``precount_attempts`` on (the same store, consumer and policy), for
    the runs of redelivered messages; ``inbox`` itself when it already precounts or is
    leased (a leased claim counts a crash when it is taken over)."""
    if inbox.mode == "leased" or inbox.precount_attempts:
        return inbox
    twin = copy.copy(inbox)
    twin.precount_attempts = True
    return twin


@dataclass(frozen=True)
class Prepared:
    """A delivery ready for the inbox: its message id, payload and metadata.

    ``released``: whether the broker has taken the delivery back (a Kafka rebalance):
    then it is not run (again), not retried in place, and its settlement is a hand-back
    that counts nothing (``None``: never)."""

    message_id: str
    payload: Any
    delivery: Delivery
    count: int | None
    released: Callable[[], bool] | None = None

    def is_released(self) -> bool:
        return self.released is not None and self.released()


#: The reason of a delivery's settlement once the broker took it back.
RELEASED = "released"


def released(p: Prepared, exc: BaseException | None, logger: logging.Logger) -> Settlement:
    """The settlement of a delivery the broker took back (:attr:`Prepared.released`):
    handed back uncounted, at once (the broker's new holder runs it; a transaction it
    cut off rolled back, and is no failed attempt)."""
    cause = exc
    while cause is not None and cause.__cause__ is not None:
        cause = cause.__cause__  # the broker's own word (PartitionLost), not its wrapping
    why = _safe(cause) if cause is not None else None
    logger.info(
        "%s: taken back by the broker%s; left to its new holder",
        p.message_id,
        f" ({why})" if why else "",
    )
    return Settlement(Verdict(Action.RETRY, RELEASED, why, counted=False), p.message_id)


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
