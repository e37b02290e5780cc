# SPDX-License-Identifier: MIT
"""OpenTelemetry spans from onceonly's events (``pip install 'onceonly[otel]'``).

Each delivery becomes a span ``onceonly.process`` with children ``onceonly.claim``,
``onceonly.handler`` (when the handler ran) and ``onceonly.complete``, timed from the
event (the spans are recorded when the delivery ends, as children of the span current
at that moment; spans the handler opens are therefore not their children).

Across the outbox: publish with ``tx.publish(topic, payload, headers=trace_headers())``;
the relay sends the headers with the message, and a broker consumer's delivery carries
them back, so the consumer's ``onceonly.process`` span becomes a child of the span that
was current at publish time (W3C ``traceparent``, or whatever propagator is set).

Attributes: ``onceonly.scope``, ``onceonly.outcome``, ``onceonly.attempt``; the key
(``onceonly.key``) only with ``key_attribute=True``: keys may carry personal data.

.. versionadded:: 0.2
"""

from __future__ import annotations

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Status, StatusCode, Tracer
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "onceonly's tracing needs opentelemetry-api: pip install 'onceonly[otel]'"
    ) from exc

from onceonly.events import Event, EventKind

__all__ = ["OpenTelemetrySpans", "trace_headers"]


def trace_headers() -> dict[str, str]:
    """The current trace context as message headers, for ``tx.publish(..., headers=…)``.

    Returns:
        The headers of the configured propagator (``traceparent`` by default); empty
        when no span is current.

    .. versionadded:: 0.2
    """
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


_ERRORS = (EventKind.FAILED, EventKind.DEAD_LETTERED, EventKind.UNAVAILABLE, EventKind.LEASE_LOST)


class OpenTelemetrySpans:
    """A listener that records each delivery as OpenTelemetry spans.

    Args:
        tracer: the tracer (default: ``trace.get_tracer("onceonly")``).
        key_attribute: add the idempotency key as ``onceonly.key`` (off: PII).

    .. versionadded:: 0.2
    """

    def __init__(self, tracer: Tracer | None = None, *, key_attribute: bool = False) -> None:
        self.tracer = tracer or trace.get_tracer("onceonly")
        self.key_attribute = key_attribute

    def __call__(self, event: Event) -> None:
        if event.kind is EventKind.LEASE_RENEWED or event.total_seconds is None:
            return
        start = event.started_ns
        end = start + int(event.total_seconds * 1e9)
        attributes: dict[str, str | int] = {
            "onceonly.scope": event.scope,
            "onceonly.outcome": event.kind.value,
        }
        if event.attempt is not None:
            attributes["onceonly.attempt"] = event.attempt
        if self.key_attribute:
            attributes["onceonly.key"] = event.key
        parent = None
        if event.headers:  # the producer's context, carried through outbox and broker
            carrier = {k: v for k, v in event.headers.items() if isinstance(v, str)}
            parent = propagate.extract(carrier) if carrier else None
        root = self.tracer.start_span(
            "onceonly.process", parent, start_time=start, attributes=attributes
        )
        if event.kind in _ERRORS:
            root.set_status(Status(StatusCode.ERROR, event.error or event.kind.value))
        context = trace.set_span_in_context(root)
        claim_end = start + int((event.claim_seconds or 0.0) * 1e9)
        self.tracer.start_span("onceonly.claim", context, start_time=start).end(claim_end)
        done = claim_end
        if event.handler_seconds is not None:
            done = claim_end + int(event.handler_seconds * 1e9)
            handler = self.tracer.start_span("onceonly.handler", context, start_time=claim_end)
            if event.kind is EventKind.FAILED:
                handler.set_status(Status(StatusCode.ERROR, event.error or "failed"))
            handler.end(done)
        if event.kind in (EventKind.COMPLETED, EventKind.FAILED):
            self.tracer.start_span("onceonly.complete", context, start_time=done).end(end)
        root.end(end)
