# SPDX-License-Identifier: MIT
"""Prometheus metrics from onceonly's events (``pip install 'onceonly[prometheus]'``).

Labels are the scope and the outcome only (bounded cardinality): never the key.

* ``onceonly_events_total{scope, outcome}``: completed runs, replays, in-flight
  conflicts, payload mismatches, failures, dead letters, lease renewals and losses,
  store outages (``outcome`` is :class:`~onceonly.events.EventKind`'s value).
* ``onceonly_retries_total{scope}``: runs after the first (retries of failed runs and
  takeovers of lapsed claims).
* ``onceonly_claim_seconds{scope, outcome}``: from the call to the handler's start
  (or to the answer, for a replay or a conflict).
* ``onceonly_handler_seconds{scope, outcome}``: the handler's run time.

.. versionadded:: 0.2
"""

from __future__ import annotations

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "onceonly's Prometheus metrics need prometheus_client: pip install 'onceonly[prometheus]'"
    ) from exc

from onceonly.events import Event, EventKind

__all__ = ["PrometheusMetrics"]


class PrometheusMetrics:
    """A listener that counts events in Prometheus metrics.

    Args:
        registry: where the metrics are registered (default: the global registry).
        namespace: the metric name prefix.

    Example: ``Inbox(store, consumer="billing", listeners=[PrometheusMetrics()])``,
    then expose the registry (``prometheus_client.start_http_server(port)``).

    .. versionadded:: 0.2
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, namespace: str = "onceonly"
    ) -> None:
        registry = REGISTRY if registry is None else registry
        self.events = Counter(
            "events", "Deliveries by outcome", ["scope", "outcome"],
            namespace=namespace, registry=registry,
        )  # fmt: skip
        self.retries = Counter(
            "retries", "Runs after the first: retries and takeovers of lapsed claims", ["scope"],
            namespace=namespace, registry=registry,
        )  # fmt: skip
        self.claim_seconds = Histogram(
            "claim_seconds", "Time from the call to the handler's start or the answer",
            ["scope", "outcome"], namespace=namespace, registry=registry,
        )  # fmt: skip
        self.handler_seconds = Histogram(
            "handler_seconds", "Handler run time", ["scope", "outcome"],
            namespace=namespace, registry=registry,
        )  # fmt: skip

    def __call__(self, event: Event) -> None:
        outcome = event.kind.value
        self.events.labels(event.scope, outcome).inc()
        if event.kind is EventKind.LEASE_RENEWED:
            return
        if event.retry and event.kind in (EventKind.COMPLETED, EventKind.FAILED):
            self.retries.labels(event.scope).inc()
        if event.claim_seconds is not None:
            self.claim_seconds.labels(event.scope, outcome).observe(event.claim_seconds)
        if event.handler_seconds is not None:
            self.handler_seconds.labels(event.scope, outcome).observe(event.handler_seconds)
