# SPDX-License-Identifier: MIT
"""One consumer loop over thin broker transports.

A :class:`Transport` knows one broker: how to receive deliveries and settle each one
(ack, retry after a delay, dead-letter with given headers, extend the lease of those in
flight). :class:`ConsumerLoop` owns everything else, the same for every broker:

* concurrency: at most ``concurrency`` transactions run (a handler alone, or a batch:
  each holds one store connection); a transport is asked for at most as many
  deliveries as there are free slots (``max(concurrency, batch_size)``: the prefetch),
  and what it returns beyond that (or while stopping) is handed back at once;
* the inbox call and the verdict (:class:`~onceonly.brokers._consumer.Deliveries`);
* settlement: ack only after the inbox's commit; a counted retry after the one
  jittered backoff (:mod:`onceonly._core.backoff`); a dead letter with the one header
  envelope (:mod:`onceonly._core.deadletter`), acked only once it is published, else
  retried; the catch-all: whatever fails on the way, the delivery is retried;
* the poison rule: a delivery the broker counts past ``max_deliveries`` is
  dead-lettered without running once the store counted ``max_deliveries - 1`` attempts
  of its own (the broker also counts what a crashed worker merely held; this counts the
  crashes of atomic mode);
* batches (``batch_size`` > 1): deliveries already received are gathered (at most
  ``batch_wait`` after the first) into one ``inbox.process_batch`` transaction, then
  each is settled by its own outcome by the same rules (:mod:`._consumer_batch`);
* isolation of a suspect: a redelivered delivery (it may have killed a worker) never
  joins a batch; it runs exclusively (once no other handler runs; none starts until it
  is settled), its attempt counted in the store before it runs, so its crash is
  counted against it alone; and a consumer that (re)starts is cautious: it receives one delivery
  at a time, the next once the previous is settled, while they come redelivered (a push
  transport opens with a window of one); the first fresh delivery widens the window
  (``transport.widen()``). A crash then counts only the message that caused it, so only
  the poison message reaches ``max_deliveries`` (docs/brokers.md, "A worker that
  crashes");
* lease extension: every ``transport.extend_every`` seconds, the deliveries in flight
  are extended in one call; with a leased inbox (one delivery at a time, no batches),
  only those whose lease, renewed in the same step, is still held (:mod:`._leases`);
* the lifecycle: ``run()`` (one at a time; a stopped consumer may run again;
  ``stop()`` before the first run started makes that run return at once),
  ``stop()`` (stop receiving, let running handlers finish and settle up to
  ``shutdown_timeout``, cancel the rest, close), ``async with`` (start, and raise the
  start-up error at once; on exit stop, and raise what ended the run unless the block
  raised).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

from onceonly._core.deadletter import envelope
from onceonly._core.pool import check_pool_size
from onceonly._core.settle import MAX_DELIVERIES, Action, Backoff
from onceonly.brokers._consumer import (
    BatchRunner,
    Deliveries,
    Handler,
    InFlightTracker,
    MessageIds,
    Prepared,
    Settlement,
    decode_body,
    pause,
    unexpected,
)
from onceonly.brokers._consumer_batch import run_batch
from onceonly.brokers._ids import content_type_of
from onceonly.brokers._leases import Leases
from onceonly.brokers._transport import Incoming, Transport
from onceonly.errors import BrokerUnavailable, ConfigurationError
from onceonly.inbox import AsyncInbox
from onceonly.messaging import Delivery

__all__ = ["RECONNECT", "ConsumerLoop", "Incoming", "Transport"]  # re-exported

#: Delays between failed receives (the broker went away): the one jittered backoff.
RECONNECT = Backoff(0.1, 5.0)


L = TypeVar("L", bound="ConsumerLoop")


class ConsumerLoop:
    """Runs deliveries from a :class:`Transport` through an inbox (see the module).

    A broker's consumer calls ``__init__`` with the settings every consumer shares,
    then sets :attr:`transport`.
    """

    transport: Transport

    def __init__(
        self,
        inbox: AsyncInbox,
        handler: Handler,
        *,
        message_id: MessageIds | str | Callable[[Any], str] | None,
        max_deliveries: int | None,
        retry_delay: float,
        max_backoff: float,
        dedup_window: str,
        concurrency: int,
        shutdown_timeout: float,
        logger: logging.Logger,
        batch_size: int = 1,
        batch_wait: float = 0.01,
        batch: BatchRunner | None = None,
    ) -> None:
        if batch_size < 1 or not batch_wait >= 0:
            raise ConfigurationError("batch_size must be at least 1 and batch_wait >= 0")
        if batch_size > 1 and inbox.mode == "leased":
            raise ConfigurationError("batch_size > 1 needs an inbox in atomic mode (SQL store)")
        self.inbox = inbox
        self.handler = handler
        self.ids = MessageIds.of(message_id)
        self.retry_delay = retry_delay
        self.max_backoff = max_backoff
        self.deliveries = Deliveries(
            inbox,
            handler,
            self.ids,
            max_deliveries=max_deliveries,
            backoff=Backoff(retry_delay, max_backoff),
            logger=logger,
            dedup_window=dedup_window,
            batch=batch,
        )
        self.max_deliveries = self.deliveries.max_deliveries
        self.batch_size = batch_size
        self.batch_wait = batch_wait
        #: transactions (handlers, or batches: one each) running at once; each holds
        #: one store connection in atomic mode
        self.transactions = concurrency
        self._running = asyncio.Semaphore(concurrency)
        # a batch is cut from the deliveries in flight: room for one batch at least
        self.concurrency = concurrency = max(concurrency, batch_size)
        self.shutdown_timeout = shutdown_timeout
        self._loop_log = logger
        self._tracker = InFlightTracker(concurrency)
        self._free = concurrency
        self._slots = asyncio.Condition()
        self._in_flight: dict[int, Incoming] = {}
        self._leases = Leases(inbox, logger)  # leased mode: the claim of each delivery
        self._stop: asyncio.Event | None = None
        self._done: asyncio.Event | None = None
        self._started = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._random = random.Random()
        self._ran = self._stopped_early = False
        self._pool_checked = False

    # -- lifecycle ------------------------------------------------------------------

    async def run(self) -> None:
        """Consume until :meth:`stop` is called or the task is cancelled.

        A cancellation does not wait: running handlers are cancelled, their
        transactions roll back and their messages are handed back.

        Raises:
            RuntimeError: this consumer is already running.
        """
        if self._done is not None:
            raise RuntimeError("this consumer is already running")
        if self._stopped_early:
            return  # stop() came before this first run() started
        self._ran = True
        self._done, self._stop = asyncio.Event(), asyncio.Event()
        self._free = self.concurrency
        graceful = False
        extender: asyncio.Task[None] | None = None
        try:
            await self.transport.open()
            bounds = await self.transport.bounds(self.deliveries.redeliveries_bound)
            self.deliveries.check_window(bounds, self.transport.where)
            self._check_pool()
            if self.transport.extend_every:
                extender = asyncio.ensure_future(self._extend_loop(self.transport.extend_every))
            self._started.set()
            await self._consume(self._stop)
            graceful = True
        finally:
            try:
                await self._shutdown(graceful, extender)
            finally:
                done, self._done, self._stop = self._done, None, None
                self._started = asyncio.Event()
                done.set()

    def _check_pool(self) -> None:
        """Warn once when atomic transactions outnumber the store's pool connections
        (each handler, or each batch, holds one for its whole run: the rest wait, then
        time out). The pool is the caller's to size (it may serve other code), so it is
        not resized here."""
        if self._pool_checked or self.inbox.mode == "leased":
            return
        self._pool_checked = True
        found = check_pool_size(self.transactions, self.inbox.store.pool_size)
        if not found.ok:
            self._loop_log.warning("%s: %s; %s", self.transport.where, found.what, found.fix)

    async def stop(self) -> None:
        """Stop receiving, let running handlers finish and settle (up to
        ``shutdown_timeout``), then close. Returns once :meth:`run` has ended. Before
        the first run has started (``create_task(c.run())`` then ``c.stop()``), that
        run returns at once; after a run ended it does nothing."""
        done, stop = self._done, self._stop
        if done is None or stop is None:
            self._stopped_early = not self._ran
            return
        stop.set()
        self.transport.wake()
        async with self._slots:
            self._slots.notify_all()
        await done.wait()

    async def __aenter__(self: L) -> L:
        self._task = task = asyncio.ensure_future(self.run())
        started = asyncio.ensure_future(self._started.wait())
        await asyncio.wait({started, task}, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            started.cancel()
            task.result()  # raises the start-up error
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        task, self._task = self._task, None
        await self.stop()
        if task is None:
            return
        try:
            await task
        except Exception:
            if et is None:
                raise  # what ended the run (a lost connection)
            self._loop_log.exception("%s: the consumer failed", self.transport.where)

    async def _shutdown(self, graceful: bool, extender: asyncio.Task[None] | None) -> None:
        with contextlib.suppress(Exception):
            await self.transport.stop_receiving()
        await self._tracker.drain(self.shutdown_timeout if graceful else 0.0)
        if extender is not None:
            extender.cancel()
            await asyncio.gather(extender, return_exceptions=True)
        await self.transport.close(graceful)
        self._loop_log.info("stopped consuming %s", self.transport.where)

    # -- receiving ------------------------------------------------------------------

    async def _take_slots(self, stop: asyncio.Event, alone: bool) -> int:
        """Free slots, once there is one (``alone``: once every handler has ended)."""
        need = self.concurrency if alone else 1
        async with self._slots:
            await self._slots.wait_for(lambda: self._free >= need or stop.is_set())
            return 0 if stop.is_set() else self._free

    async def _consume(self, stop: asyncio.Event) -> None:
        failures = 0
        pending: list[Incoming] = []  # received, not yet handed to a handler (batches)
        since = 0.0
        receiving: asyncio.Future[Sequence[Incoming]] | None = None
        # A (re)started consumer may be receiving what a crash left: it takes one
        # delivery at a time, alone, while they come redelivered, so a message that
        # kills the worker takes nothing else with it (the broker counts every message
        # a dead worker held). The first delivery that is not redelivered ends this.
        cautious = True
        try:
            while True:
                if pending and (
                    stop.is_set()
                    or len(pending) >= self.batch_size
                    or self._free <= 0
                    or time.monotonic() - since >= self.batch_wait
                ):
                    self._dispatch(pending, stop)
                    pending = []
                if receiving is None:
                    if stop.is_set() or (
                        not pending and not await self._take_slots(stop, cautious)
                    ):
                        break
                    limit = 1 if cautious else self._free
                    receiving = asyncio.ensure_future(self.transport.receive(limit))
                wait = None if not pending else max(0.0, since + self.batch_wait - time.monotonic())
                await asyncio.wait({receiving}, timeout=wait)
                if not receiving.done():
                    continue  # the batch waited long enough; the receive goes on
                got, receiving = receiving, None
                try:
                    batch = got.result()
                    failures = 0
                except BrokerUnavailable as exc:
                    failures += 1
                    delay = RECONNECT.delay(failures, self._random.random())
                    self._loop_log.warning(
                        "%s: receive failed (%s); retrying in %.1fs",
                        self.transport.where,
                        exc,
                        delay,
                    )
                    if pending:
                        self._dispatch(pending, stop)
                        pending = []
                    await pause(stop, delay)
                    continue
                for d in batch:
                    if stop.is_set() or self._free <= 0:
                        await self._hand_back(d, "stopping" if stop.is_set() else "no free slot")
                        continue
                    self._free -= 1
                    if suspect(d):
                        # it may have killed a worker: it runs alone and exclusively,
                        # its attempt counted first, so its crash is counted against
                        # it and no other message is running
                        if pending:
                            self._dispatch(pending, stop)
                            pending = []
                        await self._exclusively(d, stop)
                        continue
                    if cautious:
                        cautious = False
                        await self._widen()
                    if not pending:
                        since = time.monotonic()
                    pending.append(d)
                    if len(pending) >= self.batch_size or self.batch_size == 1:
                        self._dispatch(pending, stop)
                        pending = []
        finally:
            if receiving is not None:
                receiving.cancel()  # only when run() itself is cancelled
            if pending:
                self._dispatch(pending, stop)

    async def _widen(self) -> None:
        try:
            await self.transport.widen()
        except Exception as exc:  # the connection went away: receive() will say so
            where = self.transport.where
            self._loop_log.warning("%s: could not widen the prefetch: %r", where, exc)

    def _dispatch(self, ds: list[Incoming], stop: asyncio.Event) -> None:
        self._tracker.spawn(self._handle(ds, stop))

    async def _exclusively(self, d: Incoming, stop: asyncio.Event) -> None:
        """Run a redelivered delivery (its slot taken) once no other handler runs, and
        start nothing else until it is settled (or the consumer stops). While it waits,
        it is extended with the deliveries in flight."""
        self._in_flight[id(d)] = d
        try:
            async with self._slots:
                await self._slots.wait_for(
                    lambda: self._free >= self.concurrency - 1 or stop.is_set()
                )
        finally:
            self._in_flight.pop(id(d), None)
        if stop.is_set():
            await self._hand_back(d, "stopping")
            async with self._slots:
                self._free += 1
                self._slots.notify_all()
            return
        task = self._tracker.spawn(self._handle([d], stop))
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()

    async def _hand_back(self, d: Incoming, why: str) -> None:
        try:
            await self.transport.retry(d, 0.0)
        except Exception as exc:
            self._loop_log.debug("%s: could not hand it back (%s): %r", d.label, why, exc)

    async def _extend_loop(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                ds = list(self._in_flight.values())
                await self.transport.extend(await self._leases.still_held(ds))
            except Exception as exc:
                self._loop_log.warning("%s: lease extension failed: %r", self.transport.where, exc)

    # -- one delivery ---------------------------------------------------------------

    async def _handle(self, ds: list[Incoming], stop: asyncio.Event) -> None:
        for d in ds:
            self._in_flight[id(d)] = d
        try:
            try:
                async with self._running:  # at most `concurrency` transactions
                    settlements = await self._process(ds, stop)
            except asyncio.CancelledError:
                # shutdown could not wait: the transaction rolled back; hand them back
                for d in ds:
                    await self._hand_back(d, "cancelled")
                raise
            except Exception as exc:  # a bug of ours: still settle the deliveries
                self._loop_log.exception("%s: unexpected error", ds[0].label)
                settlements = [
                    unexpected(exc, self.deliveries.delay(d.delivery_count or 1)) for d in ds
                ]
            await asyncio.gather(
                *(self._settle_one(d, s, stop) for d, s in zip(ds, settlements, strict=True))
            )
        finally:
            for d in ds:
                self._in_flight.pop(id(d), None)
                self._leases.drop(d)
            async with self._slots:
                self._free += len(ds)
                self._slots.notify_all()

    async def _settle_one(self, d: Incoming, s: Settlement, stop: asyncio.Event) -> None:
        try:
            await self._settle(d, s, stop)
        except Exception as exc:
            # the broker went away, or a bug: it will come back (redelivery or retry)
            self._loop_log.warning("%s: could not settle it: %r", d.label, exc)
            with contextlib.suppress(Exception):
                await self.transport.retry(d, self.deliveries.delay(d.delivery_count or 1))

    async def _process(self, ds: list[Incoming], stop: asyncio.Event) -> list[Settlement]:
        """One delivery alone, or a batch in one transaction (:mod:`._consumer_batch`);
        either way the same verdicts, and the poison rule before anything runs."""
        ready = [await self._admit(d) for d in ds]
        runnable = [p for p in ready if isinstance(p, Prepared)]
        if len(ds) == 1:  # alone (always in leased mode): its claim's lease is renewed
            held = self._leases.holder(ds[0])
            counted = suspect(ds[0])  # a crash during it is counted in the store
            ran = iter(
                [await self.deliveries.run(p, stop, held, counted=counted) for p in runnable]
            )
        else:
            ran = iter(await run_batch(self.deliveries, runnable, stop) if runnable else ())
        return [p if isinstance(p, Settlement) else next(ran) for p in ready]

    async def _admit(self, d: Incoming) -> Settlement | Prepared:
        """:meth:`_prepare`; a delivery the broker counted past ``max_deliveries`` runs
        anyway when the store counted too few of its own attempts (the broker's count
        holds the crashes of the messages it was held with)."""
        ready = self._prepare(d)
        if not (isinstance(ready, Settlement) and ready.verdict.reason == MAX_DELIVERIES):
            return ready
        again = self._prepare(d, poison_rule=False)
        if isinstance(again, Prepared) and await self.deliveries.still_suspect(again):
            self._loop_log.info(
                "%s: delivered %s times, but the store counted too few attempts of its own "
                "to call it poison; running it alone",
                again.message_id,
                d.delivery_count,
            )
            return again
        return ready

    def _prepare(self, d: Incoming, *, poison_rule: bool = True) -> Settlement | Prepared:
        count = d.delivery_count
        redelivered = suspect(d)
        kind = d.content_type or content_type_of(d.headers)

        def delivery(message_id: str) -> Delivery:
            return Delivery(
                message_id=message_id,
                source=d.source,
                delivery_count=count,
                redelivered=redelivered,
                headers=d.headers,
                raw=d.raw,
            )

        return self.deliveries.prepare(
            d.broker_id,
            lambda: decode_body(d.body, kind),
            delivery,
            count,
            d.label,
            poison_rule=poison_rule,
            released=d.released,
        )

    async def _retry(self, d: Incoming, delay: float, stop: asyncio.Event) -> None:
        if delay > 0 and not self.transport.delays_retries:
            await pause(stop, delay)
            delay = 0.0
        await self.transport.retry(d, delay)

    async def _settle(self, d: Incoming, s: Settlement, stop: asyncio.Event) -> None:
        log, t = self._loop_log, self.transport
        label = s.message_id or d.label
        v = s.verdict
        if v.action is Action.ACK:
            await t.ack(d)
            if v.reason:
                log.warning("%s: acked (%s: %s)", label, v.reason, v.error)
            else:
                log.debug("%s: acked%s", label, " (replayed)" if s.replayed else "")
            return
        if v.action is Action.RETRY:
            # counted: back off, then the broker redelivers and counts it; uncounted:
            # only when stopping, so hand it back at once
            delay = v.delay if v.counted else 0.0
            await self._retry(d, delay, stop)
            log.info("%s: handed back (%s), redelivery in %.2fs", label, v.reason, delay)
            return
        headers = envelope(d.headers, v, s.message_id, d.source, drop=getattr(t, "drop", None))
        try:
            await t.dead_letter(d, headers, s.message_id)
        except Exception as exc:
            delay = self.deliveries.delay(d.delivery_count or 1)
            log.error("%s: dead-letter publish failed, left for redelivery: %r", label, exc)
            await self._retry(d, delay, stop)
            return
        await t.ack(d)
        log.warning("%s: dead-lettered (%s) and acked", label, v.reason)


def suspect(d: Incoming) -> bool:
    """Whether the broker gave ``d`` before (its redelivered flag, else its count)."""
    return d.redelivered if d.redelivered is not None else (d.delivery_count or 1) > 1
