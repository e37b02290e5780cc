# SPDX-License-Identifier: MIT
"""Events: what happened to a delivery, as frozen objects handed to listeners (spec §8.5).

An :class:`EventHook` holds listeners (plain callables, passed in; nothing is looked
up by name). A listener's exception is logged and never reaches the caller: metrics
must not change what a delivery does. Metrics (``onceonly.metrics``) and tracing
(``onceonly.tracing``) are listeners; so is anything a user plugs in.

Times are ``time.monotonic()`` readings of this process (durations), plus the
wall-clock ``at`` (``time.time_ns()``) when the delivery started, for tracing.

.. versionadded:: 0.2
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from onceonly.errors import DeadLettered, InFlight, LeaseLost, PayloadMismatch, StoreUnavailable

__all__ = [
    "Event",
    "EventHook",
    "EventKind",
    "HttpEvents",
    "Listener",
    "Observation",
    "UNMATCHED_ROUTE",
    "http_label",
]

log = logging.getLogger(__name__)


class EventKind(str, enum.Enum):
    """What happened. ``outcome`` labels in metrics are these values."""

    COMPLETED = "completed"  # the handler ran and its result was stored
    REPLAYED = "replayed"  # a duplicate: the stored result was returned
    IN_FLIGHT = "in_flight"  # another delivery held the key
    MISMATCH = "mismatch"  # same key, another payload
    FAILED = "failed"  # the handler raised; the failure was recorded
    DEAD_LETTERED = "dead_lettered"  # the key is dead (max attempts reached)
    LEASE_RENEWED = "lease_renewed"  # leased mode: a heartbeat extended the lease
    LEASE_LOST = "lease_lost"  # leased mode: the claim was taken over meanwhile
    UNAVAILABLE = "unavailable"  # the store went away (not counted as an attempt)


@dataclass(frozen=True)
class Event:
    """One thing that happened to a delivery of ``(scope, key)``.

    Attributes:
        kind: what happened.
        scope: the consumer or function scope (a metrics label).
        key: the idempotency key (never a metrics label; off in spans by default).
        attempt: the run's number (1 = first) when the handler ran.
        claim_seconds: from the call to the handler's start (or to the answer when the
            handler did not run).
        handler_seconds: the handler's run time, when it ran.
        total_seconds: the whole call.
        started_ns: wall clock when the call started (``time.time_ns()``).
        error: the exception's type name for failures.
        headers: the broker message's headers, when the delivery came from a broker
            consumer (tracing extracts the producer's context from them).
        lateness: for a replay, seconds from the record's completion to this duplicate
            (store clock), ``None`` otherwise.
        ttl: for a replay, the record's ttl in seconds (``None``: kept for ever).

    .. versionchanged:: 0.4 ``lateness`` and ``ttl``.
    """

    kind: EventKind
    scope: str
    key: str
    attempt: int | None = None
    claim_seconds: float | None = None
    handler_seconds: float | None = None
    total_seconds: float | None = None
    started_ns: int = 0
    error: str | None = None
    headers: Mapping[str, Any] = field(default_factory=dict, compare=False)
    lateness: float | None = None
    ttl: float | None = None

    @property
    def retry(self) -> bool:
        """Whether the run retook a key an earlier run had claimed (attempt > 1): a
        retry of a failed run or a takeover of a lapsed claim."""
        return self.attempt is not None and self.attempt > 1


Listener = Callable[[Event], None]


class EventHook:
    """Listeners of events; :meth:`emit` calls each, logging (never raising) errors.

    Args:
        listeners: callables taking an :class:`Event`.
    """

    def __init__(self, listeners: Iterable[Listener] = ()) -> None:
        self.listeners: tuple[Listener, ...] = tuple(listeners)

    def __bool__(self) -> bool:
        return bool(self.listeners)

    def emit(self, event: Event) -> None:
        """Hand ``event`` to every listener; a listener's exception is logged."""
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:
                log.exception(
                    "event listener %r failed on %s (scope %s)", listener, event.kind.value,
                    event.scope,
                )  # fmt: skip


_ERRORS: tuple[tuple[type[BaseException], EventKind], ...] = (
    (InFlight, EventKind.IN_FLIGHT),
    (PayloadMismatch, EventKind.MISMATCH),
    (DeadLettered, EventKind.DEAD_LETTERED),
    (LeaseLost, EventKind.LEASE_LOST),
    (StoreUnavailable, EventKind.UNAVAILABLE),
)


class Observation:
    """Times one call (claim, handler, completion) and emits its events at the end."""

    def __init__(
        self, hook: EventHook, scope: str, key: str, headers: Mapping[str, Any] | None = None
    ) -> None:
        self.hook = hook
        self.scope = scope
        self.key = key
        self.headers: Mapping[str, Any] = headers or {}
        self.started_ns = time.time_ns()
        self.t0 = time.monotonic()
        self.handler_start: float | None = None
        self.handler_end: float | None = None
        self.attempt: int | None = None

    def handler_started(self, attempt: int | None = None) -> None:
        self.handler_start = time.monotonic()
        self.handler_end = None
        self.attempt = attempt

    def handler_ended(self) -> None:
        self.handler_end = time.monotonic()

    def _event(
        self,
        kind: EventKind,
        error: str | None = None,
        lateness: float | None = None,
        ttl: float | None = None,
    ) -> Event:
        end = time.monotonic()
        start = self.handler_start
        claim = (start if start is not None else end) - self.t0
        handler = None if start is None else (self.handler_end or end) - start
        return Event(
            kind, self.scope, self.key, self.attempt, claim, handler, end - self.t0,
            self.started_ns, error, self.headers, lateness, ttl,
        )  # fmt: skip

    def returned(
        self, replayed: bool, attempt: int, lateness: float | None = None, ttl: float | None = None
    ) -> None:
        """The call returned: a replay (``lateness`` and ``ttl``: see :class:`Event`), or
        a completed run of ``attempt``."""
        if not replayed:
            self.attempt = attempt
            self.hook.emit(self._event(EventKind.COMPLETED))
            return
        self.hook.emit(self._event(EventKind.REPLAYED, None, lateness, ttl))

    def raised(self, exc: BaseException) -> None:
        """The call raised ``exc``: classify it (a handler's own error is a failure)."""
        name = type(exc).__name__
        ran = self.handler_start is not None
        for cls, kind in _ERRORS:
            if isinstance(exc, cls):
                if kind is EventKind.DEAD_LETTERED and ran:
                    self.hook.emit(self._event(EventKind.FAILED, name))
                self.hook.emit(self._event(kind, name))
                return
        if ran:
            self.hook.emit(self._event(EventKind.FAILED, name))

    def emit(self, kind: EventKind, error: str | None = None) -> None:
        """An event of ``kind`` now (renewals; a response that was not stored)."""
        self.hook.emit(self._event(kind, error))


UNMATCHED_ROUTE = "<unmatched>"
"""The route label of a request no route template matched (never its concrete path)."""


def http_label(method: str, route: str | None) -> str:
    """The ``scope`` of an HTTP request's events: ``http:METHOD route-template``.

    A bounded label: the method and the route template (``/orders/{id}``), never the
    concrete path, the principal or the key (the record's own scope holds the principal's
    hash, one per client, so it is not used). ``route=None``: no template matched.

    .. versionadded:: 0.3
    """
    return f"http:{method} {route if route is not None else UNMATCHED_ROUTE}"


class HttpEvents:
    """The events of one keyed HTTP request, labelled by :func:`http_label`.

    Each request ends in one outcome: ``replayed`` (a duplicate answered from the
    record), ``completed`` (its response was stored, or the key completed as served
    without a replayable response: a stream, over the size limit), ``failed`` (the
    handler raised, or its response was not stored and the key was given back: a 5xx;
    or the store stayed away for the final write), ``lease_lost`` (a stalled holder; the
    winner's response was sent), or the claim's refusal (``in_flight``, ``mismatch``,
    ``dead_lettered``, ``unavailable``). Listeners are those of :class:`EventHook`: Prometheus
    (``onceonly.prometheus``), OpenTelemetry (``onceonly.tracing``),
    ``DuplicateCounter``, or any callable.

    Args:
        hook: the middleware's listeners.
        method: the request's method.
        route: the matched route template, or ``None``.
        key: the idempotency key (an event field, never a metrics label).

    .. versionadded:: 0.3
    """

    def __init__(self, hook: EventHook, method: str, route: str | None, key: str) -> None:
        self.label = http_label(method, route)
        self._seen = Observation(hook, self.label, key) if hook else None

    def refused(self, exc: BaseException) -> None:
        """The claim was refused with ``exc`` (in flight, mismatch, dead, store down)."""
        if self._seen is not None:
            self._seen.raised(exc)

    def replayed(self) -> None:
        """The stored response was sent."""
        if self._seen is not None:
            self._seen.returned(True, 0)

    def started(self, attempt: int) -> None:
        """The handler starts (run ``attempt`` of the key)."""
        if self._seen is not None:
            self._seen.handler_started(attempt)

    def stored(self, attempt: int) -> None:
        """The handler's response was stored (or the key completed as served)."""
        if self._seen is not None:
            self._seen.handler_ended()
            self._seen.returned(False, attempt)

    def not_stored(self, error: str) -> None:
        """The handler answered, but its response was not stored (the key given back)."""
        if self._seen is not None:
            self._seen.handler_ended()
            self._seen.emit(EventKind.FAILED, error)

    def raised(self, exc: BaseException) -> None:
        """The handler raised ``exc``, or its end could not be written (``LeaseLost``,
        ``OutcomeNotRecorded``)."""
        if self._seen is not None:
            self._seen.handler_ended()
            self._seen.raised(exc)

    def relabel(self, listener: Listener) -> Listener:
        """``listener``, handed every event with this request's label as its ``scope``
        (for the events of an atomic route's inbox, whose scope is the record's).

        Args:
            listener: an event listener.

        Returns:
            The listener seeing relabelled events.
        """
        label = self.label

        def relabelled(event: Event) -> None:
            listener(dataclasses.replace(event, scope=label))

        return relabelled
