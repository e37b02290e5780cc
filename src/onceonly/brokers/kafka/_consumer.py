# SPDX-License-Identifier: MIT
"""Kafka (through confluent-kafka): an outbox publisher and an inbox consumer whose
offsets can commit in the business transaction (docs/spec.md §4.9).

Why confluent-kafka: measured against Tansu (a Kafka-compatible broker), its
idempotent and transactional producers work; aiokafka's idempotent producer is refused
(``InitProducerIdRequest`` answers ``UnknownError``). It is synchronous: the consumer
polls in a thread of its own and the publisher awaits delivery reports served by
another, so the event loop never blocks.

Publisher (:class:`KafkaPublisher`): an idempotent producer (``acks=all``); the outbox
row id travels as the ``onceonly-message-id`` header, the outbox key as the record key
(one key, one partition: per-key order); ``publish`` returns once the broker's delivery
report says the record is written.

Consumer (:class:`KafkaConsumer`), on the one consumer loop with the options and
meanings of the other consumers:

* the message id is the ``onceonly-message-id`` header, else what ``message_id``
  names (a payload field, a callable, ``"content"``), else ``topic/partition/offset``;
* **order** (``ordering="key"``): concurrent across partitions; within a partition
  concurrent only across different record keys (records with one key run in offset
  order; records without a key are not ordered among themselves);
  ``ordering="partition"`` runs a partition's records one at a time in offset order.
  An offset is committed only once every record before it in its partition is
  settled;
* **offsets** ``"store"`` (the default with an atomic inbox on a SQL store): the
  group's position per partition is a row written in the same transaction as the
  claim and the handler's writes, fenced by an epoch bumped on each assignment (a
  zombie member cannot move it, nor commit the writes of a record whose partition
  moved on); on assignment the consumer seeks to it. Kafka's group offsets follow as
  a hint. ``"kafka"``: commit Kafka's group offsets after processing;
* Kafka keeps no delivery count: a record handed back runs again from its place after
  the backoff (records of its key wait behind it), and ``tx.delivery.delivery_count``
  counts this consumer's deliveries. With ``offsets="store"`` the positions row also
  keeps the offset below which records were handed to handlers (written before they
  are): after an assignment, the records from the stored position up to it may have
  been running when a member died, so each runs **alone and exclusively, its attempt
  counted in the store first**, as a redelivered message does on the other brokers. A
  record that kills the worker is then dead-lettered once its counted attempts reach
  ``max_attempts``, and only it: its neighbours commit once. With ``offsets="kafka"``
  nothing tells which records a dead member held: only an inbox that pre-counts every
  attempt (``AsyncInbox(precount_attempts=True)``) counts such a crash (the consumer
  warns when it is created on an atomic inbox that does not), and the records running
  beside it are counted too;
* dead letters go to ``<topic>.dead`` (created when missing) with the ``onceonly-*``
  headers, the original key and value;
* rebalances: on revoke nothing more is taken from the lost partitions, running
  handlers settle (up to ``revoke_timeout``), positions are written and offsets
  committed; a record whose partition was lost is never acked. A transaction that
  ends after its partition was lost rolls back (:class:`PartitionLost`) and counts no
  attempt: the new owner runs the record.

Logs go to ``onceonly.brokers.kafka``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

try:
    import confluent_kafka  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "onceonly.brokers.kafka needs the kafka extra: pip install 'onceonly[kafka]'"
    ) from exc

from onceonly.brokers._consumer import Handler, MessageIds
from onceonly.brokers._loop import ConsumerLoop
from onceonly.brokers.kafka._positions import DEFAULT_TABLE, PartitionLost, Positions
from onceonly.brokers.kafka._publisher import KafkaPublisher
from onceonly.brokers.kafka._transport import KafkaTransport
from onceonly.brokers.kafka._wire import client_config
from onceonly.errors import ConfigurationError
from onceonly.inbox import AsyncInbox, AsyncTx, BatchItem, Outcome

__all__ = ["KafkaConsumer", "KafkaPublisher", "PartitionLost"]

log = logging.getLogger("onceonly.brokers.kafka")

_SQL = ("postgresql", "sqlite", "mysql")

#: set while a batch runs: its transaction writes the positions, not each handler
_BATCHED: ContextVar[bool] = ContextVar("onceonly_kafka_batched", default=False)


class KafkaConsumer(ConsumerLoop):
    """Consumes Kafka topics as a member of a consumer group through an
    :class:`~onceonly.AsyncInbox`.

    Args:
        inbox: the inbox that deduplicates and records each record.
        handler: ``async handler(payload, tx)``; ``tx.delivery.raw`` is the
            confluent-kafka ``Message``.
        topics: the topics to consume.
        group: the consumer group (``group.id``); a new group starts from the earliest
            offset.
        bootstrap: ``host:port[,host:port…]``.
        config: client settings passed to confluent-kafka (security, timeouts). For
            fast group joins in tests: ``{"session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000}``. ``enable.auto.commit`` is always off.
        offsets: ``"store"`` (positions in the store, in the handler's transaction),
            ``"kafka"`` (group offsets committed after processing) or ``None``: ``"store"``
            with an atomic inbox on a SQL store, else ``"kafka"``.
        positions_table: the table of positions (``offsets="store"``), created when
            missing.
        message_id: a :class:`MessageIds`, or its fallback when a record carries no
            ``onceonly-message-id`` header: a payload field name, a callable or
            ``"content"``; ``None`` (the default): ``topic/partition/offset``.
        dead_letter: the dead-letter topic (default ``"<topic>.dead"`` per topic).
        declare: create missing topics (with ``partitions`` partitions); with
            ``False`` they must exist. Dead-letter topics are always created when missing.
        partitions: partitions of a topic created by ``declare``.
        concurrency: handlers running at once.
        max_deliveries: a record delivered more times than this by this consumer is
            dead-lettered without running (default: the inbox's ``max_attempts`` + 5).
        retry_delay: the first backoff step before a failed record runs again; it
            doubles per delivery (jittered, capped at ``max_backoff``).
        max_backoff: the longest such delay.
        publish_timeout: seconds to wait for a dead letter's delivery report.
        shutdown_timeout: seconds ``stop()`` waits for running handlers.
        revoke_timeout: seconds a rebalance waits for the handlers running on the
            revoked partitions.
        position_interval: seconds between writes of positions moved without a
            transaction (replays, dead letters).
        max_buffer: records fetched ahead; fetching pauses beyond it.
        ordering: ``"key"`` (records with one key in offset order, other keys and
            records without a key at once) or ``"partition"`` (a partition's records
            one at a time, in offset order).
        dedup_window: at start, the inbox's ttl against each topic's ``retention.ms`` (a
            group reads a record again as long as the topic keeps it): ``"warn"``,
            ``"refuse"`` or ``"off"``. A retention the broker does not report is logged
            as unknown, never taken as covered.
        batch_size: records processed together in one inbox transaction.
        batch_wait: seconds a batch waits for more records once the first arrived.

    .. versionadded:: 0.4
    """

    def __init__(
        self,
        inbox: AsyncInbox,
        handler: Handler,
        *,
        topics: Sequence[str],
        group: str,
        bootstrap: str = "localhost:9092",
        config: Mapping[str, Any] | None = None,
        offsets: str | None = None,
        positions_table: str = DEFAULT_TABLE,
        message_id: MessageIds | str | Callable[[Any], str] | None = None,
        dead_letter: str | None = None,
        declare: bool = True,
        partitions: int = 1,
        concurrency: int = 16,
        max_deliveries: int | None = None,
        retry_delay: float = 0.1,
        max_backoff: float = 5.0,
        publish_timeout: float = 10.0,
        shutdown_timeout: float = 30.0,
        revoke_timeout: float = 10.0,
        position_interval: float = 1.0,
        max_buffer: int = 1000,
        ordering: str = "key",
        dedup_window: str = "warn",
        batch_size: int = 1,
        batch_wait: float = 0.01,
    ) -> None:
        if isinstance(topics, str) or not topics or not all(topics):
            raise ConfigurationError("topics must be a non-empty list of topic names")
        if not group:
            raise ConfigurationError("group must be a non-empty consumer group name")
        sql = inbox.store.dialect in _SQL and inbox.mode != "leased"
        if offsets is None:
            offsets = "store" if sql else "kafka"
        if offsets not in ("store", "kafka"):
            raise ConfigurationError("offsets must be 'store' or 'kafka'")
        if offsets == "store" and not sql:
            raise ConfigurationError("offsets='store' needs an atomic inbox on a SQL store")
        if ordering not in ("key", "partition"):
            raise ConfigurationError("ordering must be 'key' or 'partition'")
        if partitions < 1 or max_buffer < 1:
            raise ConfigurationError("partitions and max_buffer must be at least 1")
        self.offsets = offsets
        if offsets == "kafka" and inbox.mode != "leased" and not inbox.precount_attempts:
            log.warning(
                "KafkaConsumer(group %r, offsets='kafka'): the inbox does not pre-count"
                " attempts, so a record whose handler kills the worker is never counted"
                " (Kafka keeps no delivery count): it runs again after every restart and is"
                " never dead-lettered. Use offsets='store', or pass"
                " AsyncInbox(..., precount_attempts=True) to count it (one more write per"
                " record).",
                group,
            )
        positions = Positions(inbox.store, group, positions_table) if offsets == "store" else None
        named = message_id is not None and not (
            isinstance(message_id, MessageIds) and message_id.fallback is None
        )
        super().__init__(
            inbox,
            self._with_position(handler) if positions is not None else handler,
            message_id=message_id,
            max_deliveries=max_deliveries,
            retry_delay=retry_delay,
            max_backoff=max_backoff,
            dedup_window=dedup_window,
            concurrency=concurrency,
            shutdown_timeout=shutdown_timeout,
            logger=log,
            batch_size=batch_size,
            batch_wait=batch_wait,
            batch=self._batch_with_positions if positions is not None else None,
        )
        self.topics = list(topics)
        self.group = group
        self.positions = positions
        self.transport = self._transport = KafkaTransport(
            topics=self.topics,
            group=group,
            config=client_config(bootstrap, config, consumer=True),
            dead_letter=(lambda topic: dead_letter) if dead_letter else (lambda t: f"{t}.dead"),
            declare=declare,
            partitions=partitions,
            positions=positions,
            named_key=named,
            revoke_timeout=revoke_timeout,
            publish_timeout=publish_timeout,
            position_interval=position_interval,
            max_buffer=max(max_buffer, self.concurrency),
            ordering=ordering,
            log=log,
            check_retention=dedup_window != "off",
            # one handed-mark write per this many offsets handed out; after a crash, at
            # most this many records beyond those running were never started
            reserve_ahead=max(32, 2 * self.concurrency),
        )

    def _with_position(self, handler: Handler) -> Handler:
        """The handler, then the position write in its transaction (``offsets="store"``);
        in a batch the batch's transaction writes the positions once, at its end."""

        async def run(payload: Any, tx: AsyncTx) -> Any:
            result = await handler(payload, tx)
            if not _BATCHED.get():
                await self._transport.write_position(tx)
            return result

        return run

    async def _batch_with_positions(
        self, items: list[BatchItem], handler: Handler
    ) -> list[Outcome[Any]]:
        """A batch in one transaction: the inbox's batch joined to it, then one position
        write per partition for the records it settled (``offsets="store"``).

        The write is conditional on the member's epoch even when the position does not
        move, so a zombie's whole batch rolls back (:class:`PartitionLost`)."""
        inbox = self.inbox
        async with inbox.store.transaction(None, lock_wait=inbox.wait) as outer:
            batched = _BATCHED.set(True)
            try:
                outcomes = await inbox.process_batch(items, handler, connection=outer.connection)
            finally:
                _BATCHED.reset(batched)
            records = [i.delivery.raw for i in items if i.delivery is not None]
            settled = [
                i.delivery.raw
                for i, o in zip(items, outcomes, strict=True)
                if o.error is None and i.delivery is not None
            ]
            written = await self._transport.write_positions(outer, records, settled)
        self._transport.positions_committed(written)
        return outcomes
