# SPDX-License-Identifier: MIT
"""Events, Prometheus metrics scraped from a real /metrics endpoint, OpenTelemetry spans."""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import urllib.request
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, start_http_server

import onceonly
from onceonly.events import Event, EventHook, EventKind
from onceonly.prometheus import PrometheusMetrics
from onceonly.tracing import OpenTelemetrySpans


class Boom(Exception):
    pass


def _deliveries(store: Any, listeners: list[Any]) -> None:
    """One of each: completed, replayed, failed, retried, mismatch, dead, in flight."""
    inbox = onceonly.Inbox(store, consumer="billing", max_attempts=2, wait=0.2, listeners=listeners)

    def ok(msg: Any, tx: Any) -> int:
        return int(msg["n"])

    def boom(msg: Any, tx: Any) -> int:
        raise Boom("no")

    inbox.process("k1", {"n": 1}, ok)
    inbox.process("k1", {"n": 1}, ok)  # replay
    with pytest.raises(Boom):
        inbox.process("k2", {"n": 2}, boom)
    inbox.process("k2", {"n": 2}, ok)  # attempt 2: a retry
    with pytest.raises(onceonly.PayloadMismatch):
        inbox.process("k1", {"n": 9}, ok)
    for _ in range(2):
        with pytest.raises(Boom):
            inbox.process("k3", {"n": 3}, boom)
    with pytest.raises(onceonly.DeadLettered):
        inbox.process("k3", {"n": 3}, ok)
    held, release = threading.Event(), threading.Event()

    def slow(msg: Any, tx: Any) -> int:
        held.set()
        release.wait(10)
        return 4

    worker = threading.Thread(target=inbox.process, args=("k4", {"n": 4}, slow))
    worker.start()
    assert held.wait(10)
    try:
        with pytest.raises(onceonly.InFlight):
            inbox.process("k4", {"n": 4}, ok)
    finally:
        release.set()
        worker.join(10)


def test_inbox_emits_one_event_per_outcome() -> None:
    """Every delivery yields its event, with attempts, timings and error type names."""
    seen: list[Event] = []
    _deliveries(onceonly.open_store("memory://"), [seen.append])
    kinds = [(e.kind, e.key, e.attempt) for e in seen]
    assert kinds[:5] == [
        (EventKind.COMPLETED, "k1", 1),
        (EventKind.REPLAYED, "k1", None),
        (EventKind.FAILED, "k2", 1),
        (EventKind.COMPLETED, "k2", 2),
        (EventKind.MISMATCH, "k1", None),
    ]
    assert [e.kind for e in seen[5:]] == [
        EventKind.FAILED,
        EventKind.FAILED,
        EventKind.DEAD_LETTERED,
        EventKind.IN_FLIGHT,
        EventKind.COMPLETED,
    ]
    assert seen[2].error == "Boom" and seen[3].retry and not seen[0].retry
    first = seen[0]
    assert first.handler_seconds is not None and first.claim_seconds is not None
    assert first.total_seconds is not None
    assert first.total_seconds >= first.claim_seconds + first.handler_seconds
    assert seen[1].handler_seconds is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.scope = "x"  # type: ignore[misc]


def test_listener_errors_are_logged_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    """A failing listener is logged; the delivery and the other listeners go on."""
    seen: list[Event] = []

    def broken(event: Event) -> None:
        raise RuntimeError("listener bug")

    inbox = onceonly.Inbox(
        onceonly.open_store("memory://"), consumer="c", listeners=[broken, seen.append]
    )
    with caplog.at_level(logging.ERROR, logger="onceonly.events"):
        assert inbox.process("k", 1, lambda m, tx: 5).result == 5
    assert [e.kind for e in seen] == [EventKind.COMPLETED]
    assert "listener" in caplog.text and "listener bug" in caplog.text
    assert not EventHook() and EventHook([print])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_prometheus_metrics_scraped_from_a_real_endpoint(sql_store: Any) -> None:
    """/metrics serves counters and histograms labelled by scope and outcome, never the key."""
    registry = CollectorRegistry()
    port = _free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        _deliveries(sql_store, [PrometheusMetrics(registry)])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)

    def value(line_start: str) -> float:
        lines = [ln for ln in text.splitlines() if ln.startswith(line_start)]
        assert len(lines) == 1, line_start
        return float(lines[0].rsplit(" ", 1)[1])

    def events(outcome: str) -> float:
        return value(f'onceonly_events_total{{outcome="{outcome}",scope="billing"}}')

    assert events("completed") == 3 and events("replayed") == 1
    assert events("failed") == 3 and events("mismatch") == 1
    assert events("dead_lettered") == 1 and events("in_flight") == 1
    assert value('onceonly_retries_total{scope="billing"}') == 2  # k2 run 2, k3 run 2
    assert value('onceonly_handler_seconds_count{outcome="completed",scope="billing"}') == 3
    assert value('onceonly_claim_seconds_count{outcome="replayed",scope="billing"}') == 1
    assert '"k1"' not in text and "key=" not in text


def _spans(key_attribute: bool) -> list[Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    listener = OpenTelemetrySpans(provider.get_tracer("test"), key_attribute=key_attribute)
    inbox = onceonly.Inbox(onceonly.open_store("memory://"), consumer="c", listeners=[listener])
    inbox.process("secret-key", 1, lambda m, tx: 2)
    inbox.process("secret-key", 1, lambda m, tx: 2)
    return list(exporter.get_finished_spans())


def test_opentelemetry_spans_around_claim_handler_and_completion() -> None:
    """A run is process > claim, handler, complete; a replay is process > claim; no key."""
    spans = _spans(key_attribute=False)
    roots = [s for s in spans if s.name == "onceonly.process"]
    assert [r.attributes["onceonly.outcome"] for r in roots] == ["completed", "replayed"]
    run_children = sorted(
        s.name
        for s in spans
        if s.parent is not None and s.parent.span_id == roots[0].context.span_id
    )
    assert run_children == ["onceonly.claim", "onceonly.complete", "onceonly.handler"]
    replay_children = [
        s.name
        for s in spans
        if s.parent is not None and s.parent.span_id == roots[1].context.span_id
    ]
    assert replay_children == ["onceonly.claim"]
    for span in spans:
        assert span.start_time <= span.end_time
        assert "onceonly.key" not in (span.attributes or {})
    assert (
        roots[0].attributes["onceonly.scope"] == "c"
        and roots[0].attributes["onceonly.attempt"] == 1
    )
    keyed = [s for s in _spans(key_attribute=True) if s.name == "onceonly.process"]
    assert keyed[0].attributes["onceonly.key"] == "secret-key"


async def test_async_inbox_emits_events() -> None:
    """AsyncInbox emits the same events."""
    seen: list[Event] = []
    store = onceonly.open_async_store("memory://")
    inbox = onceonly.AsyncInbox(store, consumer="c", listeners=[seen.append])

    async def handler(msg: Any, tx: Any) -> int:
        return 1

    await inbox.process("k", 1, handler)
    await inbox.process("k", 1, handler)
    assert [e.kind for e in seen] == [EventKind.COMPLETED, EventKind.REPLAYED]
    await store.close()


def test_extras_are_not_imported_by_the_root() -> None:
    """import onceonly (and an Inbox with listeners) imports neither prometheus nor otel."""
    import subprocess
    import sys

    code = (
        "import sys, onceonly; onceonly.Inbox(onceonly.open_store('memory://'), consumer='c',"
        " listeners=[print]); import onceonly.events, onceonly.admin._admin;"
        " print(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('prometheus_client', 'opentelemetry')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_idempotent_emits_renewals_completions_and_lease_lost() -> None:
    """@idempotent: lease renewals while running, completed, replayed, and a lost lease."""
    from onceonly._core.state import Expect, State, Write

    seen: list[Event] = []
    store = onceonly.open_store("memory://")
    renewed = threading.Event()

    def on(event: Event) -> None:
        seen.append(event)
        if event.kind is EventKind.LEASE_RENEWED:
            renewed.set()

    @onceonly.idempotent(store, key=lambda n: f"k{n}", scope="jobs", lease=0.3, listeners=[on])
    def job(n: int) -> int:
        if n == 1:
            assert renewed.wait(10)  # the heartbeat renews every lease / 3
        if n == 2:  # another worker takes the key over while this run works
            claim = onceonly.current_claim()
            with store.session() as s:
                s.update(
                    "jobs", "k2", Expect(claim.token, State.IN_PROGRESS),
                    Write(State.IN_PROGRESS, claim.token + 1, None, 1, lease_seconds=60),
                )  # fmt: skip
        return n

    assert job(1) == 1 and job(1) == 1
    with pytest.raises(onceonly.LeaseLost):
        job(2)
    kinds = [e.kind for e in seen if e.kind is not EventKind.LEASE_RENEWED]
    assert kinds == [EventKind.COMPLETED, EventKind.REPLAYED, EventKind.LEASE_LOST]
    renewal = next(e for e in seen if e.kind is EventKind.LEASE_RENEWED)
    assert (renewal.scope, renewal.key, renewal.attempt) == ("jobs", "k1", 1)
    assert seen[-1].handler_seconds is not None and seen[-1].error == "LeaseLost"


def test_trace_context_through_outbox_relay_and_consumer(tmp_path: Any) -> None:
    """tx.publish(headers=trace_headers()) -> relay -> delivery: the consumer's span is a
    child of the span current at publish time, in the same trace."""
    from opentelemetry import trace

    from onceonly.messaging import Delivery
    from onceonly.testing import ListPublisher
    from onceonly.tracing import trace_headers

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    store = onceonly.open_store(f"sqlite:///{tmp_path / 't.db'}")
    store.migrate()
    producer = onceonly.Inbox(store, consumer="orders")
    with tracer.start_as_current_span("checkout") as checkout:

        def place(msg: Any, tx: Any) -> None:
            tx.publish("receipts", {"order": msg}, headers=trace_headers())

        producer.process("order-1", 1, place)
    assert trace.get_current_span() is not checkout
    publisher = ListPublisher()
    onceonly.Relay(store, publisher).run_once()
    (message,) = publisher.messages
    assert "traceparent" in message.headers
    consumer = onceonly.Inbox(store, consumer="mailer", listeners=[OpenTelemetrySpans(tracer)])
    delivery = Delivery(message.id, "receipts", headers=dict(message.headers))
    consumer.process(message.id, {"order": 1}, lambda m, tx: "sent", delivery=delivery)
    process = next(s for s in exporter.get_finished_spans() if s.name == "onceonly.process")
    assert process.parent is not None
    assert process.parent.span_id == checkout.get_span_context().span_id
    assert process.context.trace_id == checkout.get_span_context().trace_id
    store.close()
