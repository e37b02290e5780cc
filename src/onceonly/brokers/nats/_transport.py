# SPDX-License-Identifier: MIT
"""NATS JetStream as a :class:`~onceonly.brokers._loop.Transport`: a durable pull
consumer, fetched at most as many messages as the loop has free slots."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from onceonly._core.window import Bound
from onceonly.brokers._transport import Incoming
from onceonly.brokers.nats import _wire as wire
from onceonly.errors import BrokerUnavailable, ConfigurationError, PublishError

__all__ = ["NatsTransport"]


class NatsTransport:
    """Fetches from a durable pull consumer; naks with JetStream's own delay; sends
    ``+WPI`` (in progress) every ``ack_wait / 3`` for the messages in flight."""

    delays_retries = True  # nak(delay=...)
    drop = staticmethod(wire.drop)

    def __init__(
        self,
        *,
        stream: str,
        subject: str,
        durable: str,
        url: str | None,
        connection: Client | None,
        ack_wait: float,
        dead_letter: str,
        create_dead_letter_stream: bool,
        poll_timeout: float,
        publish_timeout: float,
        connect_options: Mapping[str, Any],
        max_deliveries: int,
        log: logging.Logger,
    ) -> None:
        self.stream = stream
        self.subject = subject
        self.durable = durable
        self.url = url
        self.ack_wait = ack_wait
        self.dead_letter_subject = dead_letter
        self.create_dead_letter_stream = create_dead_letter_stream
        self.poll_timeout = poll_timeout
        self.publish_timeout = publish_timeout
        self.connect_options = connect_options
        self.max_deliveries = max_deliveries
        self.log = log
        self.where = f"durable {durable} on {stream}"
        self.extend_every: float | None = ack_wait / 3
        self.connection = connection
        self._owns_connection = connection is None
        self.js: JetStreamContext | None = None
        self.sub: JetStreamContext.PullSubscription | None = None
        self._config: api.ConsumerConfig | None = None

    async def open(self) -> None:
        if self.connection is None or self.connection.is_closed:
            if not self._owns_connection:
                raise nats.errors.ConnectionClosedError
            assert self.url is not None
            self.connection = await wire.connect(
                self.url, self.connect_options, max(self.publish_timeout, 5.0)
            )
        js = self.js = self.connection.jetstream(timeout=self.publish_timeout)
        config = api.ConsumerConfig(
            durable_name=self.durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait,
            max_deliver=-1,
            filter_subject=self.subject,
        )
        try:
            sub = await js.pull_subscribe(
                self.subject, durable=self.durable, stream=self.stream, config=config
            )
        except nats.js.errors.NotFoundError as exc:
            raise ConfigurationError(f"JetStream has no stream {self.stream!r}") from exc
        except nats.js.errors.BadRequestError as exc:
            raise ConfigurationError(
                f"cannot create the durable consumer {self.durable!r} on {self.stream!r}: {exc}"
            ) from exc
        self.sub = sub
        existing = self._config = (await sub.consumer_info()).config
        if existing.ack_policy not in (None, api.AckPolicy.EXPLICIT):
            raise ConfigurationError(
                f"the durable consumer {self.durable!r} has ack_policy {existing.ack_policy}; "
                "it must be explicit"
            )
        if existing.filter_subject and existing.filter_subject != self.subject:
            self.log.warning(
                "durable %s filters %s, not %s; consuming what it filters",
                self.durable,
                existing.filter_subject,
                self.subject,
            )
        if existing.ack_wait:
            self.extend_every = float(existing.ack_wait) / 3
        await self._ensure_dead_letter_stream(js)
        self.log.info(
            "consuming %s from stream %s as %s (dead letters to %s)",
            self.subject,
            self.stream,
            self.durable,
            self.dead_letter_subject,
        )

    async def bounds(self, redeliveries: Callable[[float, str], Bound]) -> list[Bound]:
        """The stream's max_age and the redeliveries' span."""
        assert self.js is not None and self._config is not None
        config, bounds = self._config, []
        stream = await self.js.stream_info(self.stream)
        if stream.config.max_age:
            bounds.append(Bound(f"stream {self.stream} max_age", float(stream.config.max_age)))
        bound = redeliveries(float(config.ack_wait or 0), "ack_wait")
        if config.max_deliver and config.max_deliver > 0:
            each = bound.seconds / self.max_deliveries
            bound = Bound(
                "max_deliver x ack_wait", min(config.max_deliver, self.max_deliveries) * each
            )
        bounds.append(bound)
        return bounds

    async def _ensure_dead_letter_stream(self, js: JetStreamContext) -> None:
        subject = self.dead_letter_subject
        try:
            await js.find_stream_name_by_subject(subject)
            return
        except nats.js.errors.NotFoundError:
            if not self.create_dead_letter_stream:
                raise ConfigurationError(
                    f"no stream captures the dead-letter subject {subject!r}"
                ) from None
        name = f"{self.stream}_dead"
        try:
            await js.add_stream(name=name, subjects=[subject])
        except nats.js.errors.APIError as exc:
            raise ConfigurationError(
                f"cannot create the dead-letter stream {name!r} for {subject!r}: {exc}"
            ) from exc
        self.log.info("created stream %s for the dead-letter subject %s", name, subject)

    async def receive(self, limit: int) -> Sequence[Incoming]:
        # nats-py's fetch() also hands over what was already queued (pull requests
        # answered together after a reconnect), so it may return more than asked: the
        # loop gives back what exceeds its free slots.
        sub = self.sub
        assert sub is not None
        try:
            msgs = await sub.fetch(limit, timeout=self.poll_timeout)
        except asyncio.TimeoutError:  # nats.errors.TimeoutError: nothing to fetch
            return ()
        except (nats.errors.Error, OSError, ValueError) as exc:
            conn = self.connection
            if conn is None or conn.is_closed:
                raise  # a connection we may not reopen (or gave up on): end run()
            raise BrokerUnavailable(f"fetch from {self.durable} failed: {exc!r}") from exc
        return [self._incoming(m) for m in msgs]

    @staticmethod
    def _incoming(msg: Msg) -> Incoming:
        headers: dict[str, str] = dict(msg.headers or {})
        count = msg.metadata.num_delivered
        return Incoming(
            broker_id=headers.get(wire.MSG_ID_HEADER) or None,
            body=msg.data,
            headers=headers,
            delivery_count=count,
            source=msg.subject,
            raw=msg,
            label=wire.label(msg),
        )

    async def widen(self) -> None:
        """Nothing to widen: ``receive`` pulls only what the loop asks for."""

    def wake(self) -> None:
        """Nothing to wake: ``receive`` returns within its poll timeout."""

    async def ack(self, d: Incoming) -> None:
        await d.raw.ack()

    async def retry(self, d: Incoming, delay: float) -> None:
        await d.raw.nak(delay=delay if delay > 0 else None)

    async def dead_letter(
        self, d: Incoming, headers: dict[str, Any], message_id: str | None
    ) -> None:
        js = self.js
        if js is None:
            raise PublishError("the consumer is not running", key=message_id)
        await js.publish(
            self.dead_letter_subject,
            d.body,
            timeout=self.publish_timeout,
            headers=wire.dead_letter_headers(headers, self.durable, d.raw),
        )

    async def extend(self, ds: Sequence[Incoming]) -> None:
        for d in ds:
            try:
                await d.raw.in_progress()
            except Exception as exc:
                self.log.debug("%s: in-progress signal failed: %r", d.label, exc)

    async def stop_receiving(self) -> None:
        # Unsubscribe first: a pull request still waiting on the server (a cancelled
        # fetch) would otherwise capture the messages the handlers nak.
        sub, self.sub = self.sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def close(self, graceful: bool) -> None:
        conn, self.js = self.connection, None
        if conn is not None and not conn.is_closed:
            with contextlib.suppress(Exception):
                await conn.flush(timeout=max(1, int(self.publish_timeout)))  # the last acks
            if self._owns_connection:
                with contextlib.suppress(Exception):
                    await conn.close()
        if self._owns_connection:
            self.connection = None
