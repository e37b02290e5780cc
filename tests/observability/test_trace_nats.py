# SPDX-License-Identifier: MIT
"""The span tree across outbox -> relay -> NATS JetStream -> consumer (real NATS)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import onceonly
from onceonly.brokers.nats import NatsPublisher
from onceonly.tracing import OpenTelemetrySpans, trace_headers
from tests.brokers.test_nats import NATS_URL, Env, consumer, env, eventually, nc, settled

__all__ = ["env", "nc"]  # fixtures used by name


async def test_consumer_span_is_a_child_of_the_publishing_span(env: Env, tmp_path: Path) -> None:
    """A message published inside a span, relayed to NATS and consumed: the consumer's
    onceonly.process span is that span's child, in its trace."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    store = onceonly.open_async_store(f"sqlite:///{tmp_path / 't.db'}")
    await store.migrate()
    producer = onceonly.AsyncInbox(store, consumer="orders")

    async def place(msg: Any, tx: Any) -> None:
        await tx.publish("events", {"order": msg}, headers=trace_headers())

    with tracer.start_as_current_span("checkout") as checkout:
        await producer.process("order-1", 1, place)
    async with NatsPublisher(NATS_URL, subject_prefix=f"oo.{env.tag}.") as publisher:
        await onceonly.AsyncRelay(store, publisher).run_once()

    async def handler(payload: Any, tx: Any) -> str:
        return "sent"

    inbox = onceonly.AsyncInbox(store, consumer="mailer", listeners=[OpenTelemetrySpans(tracer)])
    async with consumer(env, store, handler, inbox=inbox):
        await eventually(lambda: settled(env, 1))
    await store.close()
    process = next(s for s in exporter.get_finished_spans() if s.name == "onceonly.process")
    assert process.attributes is not None and process.attributes["onceonly.scope"] == "mailer"
    assert process.parent is not None
    assert process.parent.span_id == checkout.get_span_context().span_id
    assert process.context is not None
    assert process.context.trace_id == checkout.get_span_context().trace_id
