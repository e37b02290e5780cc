# SPDX-License-Identifier: MIT
"""Kafka as a :class:`~onceonly.brokers._loop.Transport` (through confluent-kafka).

* **A poll thread.** confluent-kafka is synchronous, and its rebalance callbacks run
  inside ``consume``. One thread of the transport's own calls ``consume`` all the time
  (so rebalances are served at once, also while every handler slot is busy) and hands
  the records to the event loop; every other call on the consumer (commit, pause) is
  queued to that thread. The event loop never blocks on the client. When more records
  wait than ``max_buffer``, the thread pauses fetching until half of them are settled.
* **Order and commits** follow :mod:`onceonly._core.offsets`: per partition, records
  with one key in offset order, other keys at once; a retry stays at its place (Kafka
  cannot hand a record back: the transport runs it again after the delay); the offset
  committed is the partition's watermark (every record before it settled).
* **Positions** (``offsets="store"``, :mod:`._kafka_positions`): on assignment the
  member bumps the partition's epoch and seeks to the stored position (none: Kafka's
  committed offset, then the earliest); a handler's transaction writes the position in
  the same commit as its effects; a periodic flush writes what acks without a
  transaction moved (replays, dead letters). Kafka's group offsets follow as a hint.
  Before records are handed to handlers, their partition's handed mark is raised past
  them; on assignment the records between the stored position and that mark (a dead
  member may have been running them) are delivered as redelivered: the loop runs each
  alone, its attempt counted first.
* **Rebalances.** On revoke: nothing more is handed out from the lost partitions;
  the records running there settle (up to ``revoke_timeout``); their positions are
  written and Kafka's offsets committed; then the partitions are dropped. A record
  that settles after its partition was dropped is never acked (nothing committed for
  it), and its transaction, if it writes a position, rolls back
  (:class:`~onceonly.brokers.kafka._positions.PartitionLost`). ``on_lost`` (the
  session expired) drops at once and commits nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from onceonly._core.offsets import PartitionOrder, Slot
from onceonly._core.settle import header_text
from onceonly._core.window import Bound
from onceonly.brokers._transport import Incoming
from onceonly.brokers.kafka import _wire as wire
from onceonly.brokers.kafka._positions import PartitionLost, Positions
from onceonly.errors import BrokerUnavailable, ConfigurationError
from onceonly.messaging import HEADER_MESSAGE_ID

__all__ = ["KafkaTransport"]

TP = tuple[str, int]


class KafkaTransport:
    """Consumes ``topics`` as member of ``group`` (see the module)."""

    delays_retries = True  # a retry waits at its place in the partition
    extend_every: float | None = None  # librdkafka heartbeats from its own thread

    def __init__(
        self,
        *,
        topics: Sequence[str],
        group: str,
        config: Mapping[str, Any],
        dead_letter: Callable[[str], str],
        declare: bool,
        partitions: int,
        positions: Positions | None,
        named_key: bool,
        revoke_timeout: float,
        publish_timeout: float,
        position_interval: float,
        max_buffer: int,
        ordering: str,
        log: logging.Logger,
        check_retention: bool = True,
        reserve_ahead: int = 64,
    ) -> None:
        self.topics = list(topics)
        self.ordering = ordering
        self.group = group
        self.config = dict(config)
        self.dead_letter_topic = dead_letter
        self.declare = declare
        self.partitions = partitions
        self.positions = positions
        self.named_key = named_key
        self.revoke_timeout = revoke_timeout
        self.publish_timeout = publish_timeout
        self.position_interval = position_interval
        self.max_buffer = max_buffer
        self.check_retention = check_retention
        self.reserve_ahead = max(1, reserve_ahead)
        self.log = log
        self.where = f"topics {', '.join(self.topics)} (group {group})"
        self._parts: dict[TP, PartitionOrder[Message]] = {}
        self._epochs: dict[TP, int] = {}
        #: per partition: the records below it (from the position on) may have been
        #: running when an earlier member died (read on assignment)
        self._suspect_below: dict[TP, int] = {}
        #: per partition: the handed mark this member made sure the store holds
        self._reserved: dict[TP, int] = {}
        self._owner: dict[int, tuple[TP, PartitionOrder[Message]]] = {}  # id(msg) ->
        self._kafka_committed: dict[TP, int] = {}
        self._dirty: set[TP] = set()
        self._commit_scheduled = False
        self._handing = False
        self._woken = False
        self._failure: BaseException | None = None
        self._buffered = 0
        self._want_pause = False
        self._fetch_paused = False  # on the poll thread: what the assignment was told
        self._loop: asyncio.AbstractEventLoop | None = None
        self._arrived = asyncio.Event()
        self._consumer: Consumer | None = None
        self._producer: wire.AsyncProducer | None = None
        self._thread: threading.Thread | None = None
        self._running = False
        self._commands: queue.SimpleQueue[Callable[[Consumer], None]] = queue.SimpleQueue()
        self._thread_done: asyncio.Future[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._rr = 0

    # -- lifecycle ------------------------------------------------------------------

    async def open(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._arrived = asyncio.Event()
        self._failure, self._woken, self._buffered, self._want_pause = None, False, 0, False
        admin = wire.client_config(self.config["bootstrap.servers"], self.config, consumer=False)
        wanted = [(t, self.partitions) for t in self.topics] if self.declare else []
        counts = await loop.run_in_executor(None, wire.partitions_of, admin, self.topics)
        if not self.declare:
            missing = [t for t in self.topics if t not in counts]
            if missing:
                raise ConfigurationError(f"Kafka has no topic {missing[0]!r} (declare=False)")
        for t in self.topics:  # a dead-letter topic per topic, created when missing
            wanted.append((self.dead_letter_topic(t), counts.get(t, self.partitions)))
        await loop.run_in_executor(None, wire.ensure_topics, admin, wanted)
        if self.positions is not None:
            await self.positions.create()
        self._producer = wire.AsyncProducer(admin, self.publish_timeout)
        settings = {
            "group.id": self.group,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            **self.config,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
        consumer = self._consumer = Consumer(settings)
        consumer.subscribe(
            self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        self._handing = self._running = True
        self._thread_done = loop.create_future()
        self._thread = threading.Thread(target=self._poll, name="onceonly-kafka-consumer")
        self._thread.daemon = True
        self._thread.start()
        if self.positions is not None:
            self._flusher = asyncio.ensure_future(self._flush_loop())
        self.log.info("consuming %s", self.where)

    async def bounds(self, redeliveries: Callable[[float, str], Bound]) -> list[Bound]:
        """Each topic's retention (``retention.ms``, DescribeConfigs): the group reads a
        record again as long as it is kept (a lost position, a reset). A topic whose
        retention the broker does not report is logged as unknown (never taken as
        covered); a broker that does not answer is logged too, and nothing is checked."""
        if not self.check_retention:
            return []
        loop = asyncio.get_running_loop()
        admin = wire.client_config(self.config["bootstrap.servers"], self.config, consumer=False)
        try:
            bounds, unknown = await loop.run_in_executor(
                None, wire.retention_bounds, admin, self.topics, 5.0
            )
        except Exception as exc:
            self.log.warning(
                "%s: the topics' retention could not be read (%r): the dedup window is not checked",
                self.where,
                exc,
            )
            return []
        for topic in unknown:
            self.log.warning(
                "%s: the retention of topic %r is unknown (the broker reports no"
                " retention.ms): the dedup window (the inbox ttl against how long the topic"
                " keeps a record) cannot be checked; set the topic's retention.ms",
                self.where,
                topic,
            )
        return bounds

    def wake(self) -> None:
        self._woken = True
        self._arrived.set()

    async def stop_receiving(self) -> None:
        self._handing = False
        self._want_pause = True

    async def close(self, graceful: bool) -> None:
        self._handing = False
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
            self._flusher = None
        self._running = False
        if self._thread_done is not None:
            with contextlib.suppress(Exception):
                await self._thread_done  # the thread closes the consumer (revoking)
            self._thread_done = None
        self._thread = self._consumer = None
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await self._producer.close()
            self._producer = None
        self._parts.clear()
        self._owner.clear()

    # -- the poll thread ------------------------------------------------------------

    def _call(self, fn: Callable[..., Any], *args: Any) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(fn, *args)

    def _poll(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        self._fetch_paused = False
        try:
            while self._running:
                while True:
                    try:
                        command = self._commands.get_nowait()
                    except queue.Empty:
                        break
                    try:
                        command(consumer)
                    except Exception as exc:
                        self.log.warning("%s: %r", self.where, exc)
                want = self._want_pause
                if want != self._fetch_paused:
                    with contextlib.suppress(KafkaException):
                        assigned = consumer.assignment()
                        (consumer.pause if want else consumer.resume)(assigned)
                        self._fetch_paused = want
                try:
                    messages = consumer.consume(500, 0.1)
                except KafkaException as exc:
                    self._call(self._fail, exc)
                    time.sleep(0.1)
                    continue
                good = []
                for m in messages:
                    err = m.error()
                    if err is None:
                        good.append(m)
                    elif err.fatal():
                        self._call(self._fail, KafkaException(err))
                    elif err.code() != KafkaError._PARTITION_EOF:
                        self.log.debug("%s: %s", self.where, err)
                if good:
                    self._call(self._arrive, good)
        finally:
            try:
                consumer.close()  # revokes (positions written, offsets committed)
            except Exception as exc:
                self.log.warning("%s: closing the consumer: %r", self.where, exc)
            self._call(self._thread_ended)

    def _thread_ended(self) -> None:
        if self._thread_done is not None and not self._thread_done.done():
            self._thread_done.set_result(None)

    def _run_on_loop(self, coro: Any) -> Any:
        loop = self._loop
        assert loop is not None
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = [(tp.topic, tp.partition) for tp in partitions]
        try:
            starts: dict[TP, int | None] = self._run_on_loop(self._assigned(tps))
        except Exception as exc:
            self.log.error("%s: assignment failed: %r", self.where, exc)
            self._call(self._fail, exc)
            return
        for tp in partitions:
            start = starts.get((tp.topic, tp.partition))
            tp.offset = OFFSET_INVALID if start is None else start  # None: Kafka's committed
        consumer.assign(partitions)
        # librdkafka keeps a partition's pause across unassign/assign, and a pause applied
        # while nothing was assigned reached no partition: start the new assignment
        # unpaused; the poll loop pauses it again if the buffer is still full
        with contextlib.suppress(KafkaException):
            consumer.resume(partitions)
        self._fetch_paused = False

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = [(tp.topic, tp.partition) for tp in partitions]
        try:
            offsets: dict[TP, int] = self._run_on_loop(self._revoked(tps, lost=False))
        except Exception as exc:
            self.log.warning("%s: revoke: %r", self.where, exc)
            offsets = {}
        commit = [TopicPartition(t, p, o) for (t, p), o in offsets.items() if o >= 0]
        if commit:
            try:
                consumer.commit(offsets=commit, asynchronous=False)
            except KafkaException as exc:
                self.log.info("%s: commit on revoke failed: %s", self.where, exc)
        consumer.unassign()

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = [(tp.topic, tp.partition) for tp in partitions]
        with contextlib.suppress(Exception):
            self._run_on_loop(self._revoked(tps, lost=True))
        consumer.unassign()

    # -- on the event loop ----------------------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        self._failure = exc
        self._arrived.set()

    async def _assigned(self, tps: list[TP]) -> dict[TP, int | None]:
        starts: dict[TP, int | None] = {}
        for key in tps:
            position, epoch, handed = None, 0, -1
            if self.positions is not None:
                failures = 0
                while True:
                    try:
                        position, epoch, handed = await self.positions.claim(*key)
                        break
                    except Exception as exc:
                        failures += 1
                        if not self._running or failures > 50:
                            raise
                        self.log.warning(
                            "%s: cannot read the position of %s: %r", self.where, key, exc
                        )
                        await asyncio.sleep(min(0.1 * failures, 2.0))
            self._drop(key)
            self._parts[key] = PartitionOrder(
                next=-1 if position is None else position,
                stored=-1 if position is None else position,
            )
            self._epochs[key] = epoch
            self._suspect_below[key] = self._reserved[key] = handed
            starts[key] = position
            if handed > (position or 0):
                self.log.info(
                    "%s: %s: the records from offset %s to %s may have been running when a"
                    " member died: each runs alone, its attempt counted first",
                    self.where,
                    key,
                    position or 0,
                    handed - 1,
                )
        self.log.info("%s: assigned %s", self.where, starts)
        return starts

    async def _revoked(self, tps: list[TP], *, lost: bool) -> dict[TP, int]:
        parts = {k: p for k in tps if (p := self._parts.get(k)) is not None}
        for p in parts.values():
            p.lost = True  # nothing more handed out from these
        if not lost:
            deadline = time.monotonic() + self.revoke_timeout
            while any(p.in_flight() for p in parts.values()) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        offsets: dict[TP, int] = {}
        if not lost:
            for key, p in parts.items():
                mark = p.watermark()
                if mark < 0:
                    continue
                offsets[key] = mark
                # nothing of ours runs any more: the records at and after the position
                # are suspects for the next member only if they already were
                handed = None
                if not p.in_flight() and self._reserved.get(key, -1) > mark:
                    handed = max(mark, self._suspect_below.get(key, -1))
                if self.positions is not None and (mark > p.stored or handed is not None):
                    try:
                        epoch = self._epochs[key]
                        if await self.positions.write(*key, mark, epoch, handed=handed):
                            p.stored = max(p.stored, mark)
                    except Exception as exc:
                        self.log.warning("%s: position of %s not written: %r", self.where, key, exc)
        for key in parts:
            self._drop(key)
        self.log.info("%s: %s %s", self.where, "lost" if lost else "revoked", sorted(parts))
        return offsets

    def _drop(self, key: TP) -> None:
        part = self._parts.pop(key, None)
        self._epochs.pop(key, None)
        self._suspect_below.pop(key, None)
        self._reserved.pop(key, None)
        self._dirty.discard(key)
        self._kafka_committed.pop(key, None)
        if part is not None:
            for slot in part.slots():
                self._owner.pop(id(slot.record), None)
            self._buffered -= len(part)
            self._adjust_pause()

    def _arrive(self, messages: list[Message]) -> None:
        for m in messages:
            key = (m.topic() or "", m.partition() or 0)
            part = self._parts.get(key)
            offset = m.offset()
            order = m.key() if self.ordering == "key" else b""
            if part is None or offset is None or not part.add(offset, order, m):
                continue
            self._owner[id(m)] = (key, part)
            self._buffered += 1
        self._adjust_pause()
        self._arrived.set()

    def _adjust_pause(self) -> None:
        if not self._handing:
            return
        if self._buffered >= self.max_buffer:
            self._want_pause = True
        elif self._buffered <= self.max_buffer // 2:
            self._want_pause = False

    def _take(self, limit: int) -> list[Incoming]:
        if not self._handing or limit <= 0:
            return []
        now = time.monotonic()
        parts = list(self._parts.items())
        out: list[Incoming] = []
        if not parts:
            return out
        self._rr = (self._rr + 1) % len(parts)
        marked = self.positions is not None  # nothing past the handed mark goes out
        for key, part in parts[self._rr :] + parts[: self._rr]:
            below = self._reserved.get(key, -1) if marked else None
            for slot in part.take(limit - len(out), now, below):
                out.append(self._incoming(slot.record, slot.deliveries))
            if len(out) >= limit:
                break
        return out

    def _next_wake(self) -> float | None:
        wakes = [w for p in self._parts.values() if (w := p.next_wake()) is not None]
        return min(wakes) - time.monotonic() if wakes else None

    def _incoming(self, m: Message, deliveries: int) -> Incoming:
        key = (m.topic() or "", m.partition() or 0)
        headers = wire.headers_of(m)
        given = headers.get(HEADER_MESSAGE_ID)
        if isinstance(given, str) and given:
            broker_id: str | None = given
        else:
            broker_id = None if self.named_key else wire.record_id(m)
        return Incoming(
            broker_id=broker_id,
            body=m.value() or b"",
            headers=headers,
            delivery_count=deliveries,
            source=m.topic() or "",
            raw=m,
            label=wire.record_id(m),
            # run before here, or perhaps by a member that died: alone, counted first
            redelivered=deliveries > 1 or (m.offset() or 0) < self._suspect_below.get(key, -1),
            released=lambda: self._part_of(m) is None,
        )

    async def widen(self) -> None:
        """Nothing to widen: ``receive`` takes only what the loop asks for from the
        records the poll thread buffered (Kafka keeps no delivery count to protect)."""

    async def receive(self, limit: int) -> Sequence[Incoming]:
        while True:
            if self._failure is not None:
                exc, self._failure = self._failure, None
                raise BrokerUnavailable(f"{self.where}: {exc}") from exc
            await self._reserve()
            out = self._take(limit)  # past the handed mark: the next receive reserves
            if out or self._woken:
                self._woken = False
                return out
            self._arrived.clear()
            wait = self._next_wake()
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(
                    self._arrived.wait(), None if wait is None else max(wait, 0.001)
                )

    async def _reserve(self) -> None:
        """Before records are handed to handlers (``offsets="store"``): raise each
        partition's handed mark in the store past the next record free to run (and
        ``reserve_ahead`` offsets more, so one write covers that many records), so that
        if this member dies with records running, the next one knows which records to
        run alone (:mod:`._kafka_positions`). :meth:`_take` hands out nothing past it.

        Raises:
            BrokerUnavailable: the store did not take the mark (nothing is handed out).
        """
        positions = self.positions
        if positions is None or not self._handing:
            return
        while True:
            now = time.monotonic()
            due = [
                (key, part, first)
                for key, part in self._parts.items()
                if (first := part.first_free(now)) is not None
                and first >= self._reserved.get(key, -1)
            ]
            if not due:
                return
            for key, part, first in due:
                mark = first + self.reserve_ahead
                try:
                    held = await positions.reserve(*key, mark, self._epochs[key])
                except Exception as exc:
                    raise BrokerUnavailable(
                        f"{self.where}: the records handed out of {key} not recorded: {exc!r}"
                    ) from exc
                if self._parts.get(key) is not part:
                    continue  # revoked meanwhile
                if held:
                    self._reserved[key] = max(self._reserved.get(key, -1), mark)
                else:
                    self._fenced(key, part)

    def _part_of(self, m: Message) -> tuple[TP, PartitionOrder[Message]] | None:
        """The partition ``m`` came from, while this member still owns it."""
        owned = self._owner.get(id(m))
        if owned is None or self._parts.get(owned[0]) is not owned[1]:
            return None
        return owned

    async def ack(self, d: Incoming) -> None:
        m: Message = d.raw
        owned = self._part_of(m)
        if owned is None:
            self.log.info("%s: its partition was reassigned: not acked", d.label)
            return
        key, part = owned
        offset = m.offset()
        assert offset is not None
        part.settle(offset)
        self._owner.pop(id(m), None)
        self._buffered -= 1
        self._adjust_pause()
        self._dirty.add(key)
        self._schedule_commit()
        self._arrived.set()  # its key's next record may run

    async def retry(self, d: Incoming, delay: float) -> None:
        m: Message = d.raw
        owned = self._part_of(m)
        if owned is None:
            return  # the new owner reads it again
        offset = m.offset()
        assert offset is not None
        owned[1].hand_back(offset, time.monotonic() + delay)
        if self._loop is not None:
            self._loop.call_later(max(delay, 0.0), self._arrived.set)

    async def dead_letter(
        self, d: Incoming, headers: dict[str, Any], message_id: str | None
    ) -> None:
        producer = self._producer
        if producer is None:
            raise BrokerUnavailable("the consumer is not running", key=message_id)
        m: Message = d.raw
        if not message_id:
            # undecodable: the loop never learnt the id, but the record's own header says it
            given = d.headers.get(HEADER_MESSAGE_ID)
            if isinstance(given, str) and given:
                message_id = given
                headers = {**headers, HEADER_MESSAGE_ID: header_text(given)}
        await producer.produce(
            self.dead_letter_topic(d.source),
            m.value(),  # a tombstone stays a tombstone (None, not b"")
            key=m.key(),
            headers=wire.encode_headers(headers),
            message_id=message_id,
        )

    async def extend(self, ds: Sequence[Incoming]) -> None:
        """Nothing to extend: no per-record deadline (librdkafka heartbeats)."""

    # -- positions and commits ------------------------------------------------------

    async def write_position(self, tx: Any) -> None:
        """In the handler's transaction ``tx``: the position after this record's
        settlement (other records still unsettled keep it below them).

        Raises:
            PartitionLost: the partition was reassigned (or, fenced, is owned by a
                newer member): the transaction must roll back.
        """
        positions = self.positions
        delivery = tx.delivery
        if positions is None or delivery is None:
            return
        m: Message = delivery.raw
        owned = self._part_of(m)
        if owned is None:
            raise PartitionLost(f"{wire.record_id(m)}: its partition was reassigned")
        key, part = owned
        offset = m.offset()
        assert offset is not None
        slot = part.slot(offset)
        mark = part.watermark(but=offset)
        if slot is None or mark <= part.stored:
            return
        try:
            await positions.write_in(tx, key[0], key[1], mark, self._epochs[key])
        except PartitionLost:
            self._fenced(key, part)
            raise
        slot.wrote = max(slot.wrote, mark)

    async def write_positions(
        self, tx: Any, records: Sequence[Message], settled: Sequence[Message]
    ) -> list[tuple[Slot[Message], int]]:
        """In a batch's transaction ``tx`` (``execute``): per partition of ``records``,
        the position once ``settled`` (those the batch committed) are settled, written
        fenced by the epoch even when it does not move. Returns what to record once
        ``tx`` committed (:meth:`positions_committed`).

        Raises:
            PartitionLost: a partition of ``records`` was reassigned or is owned by a
                newer member: the whole transaction must roll back.
        """
        positions = self.positions
        out: list[tuple[Slot[Message], int]] = []
        if positions is None:
            return out
        done: dict[TP, list[int]] = {}
        parts: dict[TP, PartitionOrder[Message]] = {}
        for m in records:
            owned = self._part_of(m)
            if owned is None:
                raise PartitionLost(f"{wire.record_id(m)}: its partition was reassigned")
            parts[owned[0]] = owned[1]
            done.setdefault(owned[0], [])
        for m in settled:
            owned = self._part_of(m)
            offset = m.offset()
            if owned is not None and offset is not None:
                done[owned[0]].append(offset)
        for key in sorted(parts):  # one order of row locks: concurrent batches never deadlock
            part = parts[key]
            mark = part.watermark(but=done[key])
            try:
                await positions.write_in(tx, key[0], key[1], mark, self._epochs[key])
            except PartitionLost:
                self._fenced(key, part)
                raise
            out.extend((s, mark) for o in done[key] if (s := part.slot(o)) is not None)
        return out

    def positions_committed(self, written: Sequence[tuple[Slot[Message], int]]) -> None:
        """The batch's transaction committed the positions :meth:`write_positions` wrote:
        each record's settlement now moves :attr:`PartitionOrder.stored` to it."""
        for slot, mark in written:
            slot.wrote = max(slot.wrote, mark)

    def _fenced(self, key: TP, part: PartitionOrder[Message]) -> None:
        """Another member bumped the partition's epoch: this member is a zombie for it.
        Drop the partition (nothing of it is acked or handed out any more) and rejoin
        the group, whose next assignment says who owns it now."""
        if self._parts.get(key) is not part:
            return
        self.log.error("%s: %s is owned by a newer member; rejoining", self.where, key)
        part.lost = True
        self._drop(key)

        def rejoin(consumer: Consumer) -> None:
            consumer.unsubscribe()
            consumer.subscribe(
                self.topics,
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )

        self._commands.put(rejoin)

    def _schedule_commit(self) -> None:
        if self._commit_scheduled or self._loop is None:
            return
        self._commit_scheduled = True
        self._loop.call_later(0.05, self._commit)

    def _commit(self) -> None:
        self._commit_scheduled = False
        offsets = []
        for key in self._dirty:
            part = self._parts.get(key)
            if part is None:
                continue
            mark = part.watermark()
            if mark >= 0 and mark > self._kafka_committed.get(key, -1):
                self._kafka_committed[key] = mark
                offsets.append(TopicPartition(key[0], key[1], mark))
        self._dirty.clear()
        if offsets:

            def commit(consumer: Consumer) -> None:
                with contextlib.suppress(KafkaException):
                    consumer.commit(offsets=offsets, asynchronous=True)

            self._commands.put(commit)

    async def flush_positions(self) -> None:
        """Write the positions that acks without a transaction moved."""
        positions = self.positions
        if positions is None:
            return
        for key, part in list(self._parts.items()):
            mark = part.watermark()
            if mark < 0 or mark <= part.stored:
                continue
            epoch = self._epochs[key]
            if await positions.write(*key, mark, epoch):
                part.stored = max(part.stored, mark)
            else:
                self._fenced(key, part)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.position_interval)
            try:
                await self.flush_positions()
            except Exception as exc:
                self.log.warning("%s: positions not written: %r", self.where, exc)
