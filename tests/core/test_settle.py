# SPDX-License-Identifier: MIT
"""The settlement verdict table (onceonly._core.settle): every stage x every error kind."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

import onceonly
from onceonly._core.settle import (
    MAX_ERROR_CHARS,
    Action,
    Backoff,
    Stage,
    Verdict,
    admit,
    describe,
    header_text,
    still_suspect,
    verdict,
)

BACKOFF = Backoff(base=0.1, cap=5.0)


class CachedError(Exception):
    """An error the inbox caches (``cache_errors=``)."""


# One example of every kind of exception the table distinguishes.
ERRORS: dict[str, BaseException] = {
    "cached": CachedError("declined"),
    "replayed": onceonly.ReplayedError("cached error replayed: X"),
    "in-flight": onceonly.InFlight("busy", retry_after=0.05),
    "in-flight-no-hint": onceonly.InFlight("busy"),
    "store-unavailable": onceonly.StoreUnavailable("connection lost"),
    "dead": onceonly.DeadLettered("dead", attempts=5, error="ValueError: bad"),
    "mismatch": onceonly.PayloadMismatch("other payload"),
    "invalid-key": onceonly.InvalidKey("bad key"),
    "missing-id": onceonly.MissingMessageId("no id"),
    "too-large": onceonly.TooLarge("result too large"),
    "encoding": onceonly.EncodingError("not JSON"),
    "recursion": RecursionError("maximum recursion depth exceeded"),
    "store-error": onceonly.StoreError("odd"),
    "corrupt": onceonly.CorruptRecord("unknown state"),
    "lease-lost": onceonly.LeaseLost("taken over"),
    "publish": onceonly.PublishError("not confirmed"),
    "config": onceonly.ConfigurationError("no outbox"),
    "runtime": RuntimeError("boom"),
    "value": ValueError("bad amount"),
    "key": KeyError("id"),
    "memory": MemoryError(),
}

R, D, A = Action.RETRY, Action.DEAD_LETTER, Action.ACK
COUNTED, UNCOUNTED = True, False

# (stage, error kind) -> (action, reason, counted); the reference copy of the module table.
INBOX: dict[str, tuple[Action, str | None, bool]] = {
    "cached": (A, "cached-error", COUNTED),
    "replayed": (A, "cached-error", COUNTED),
    "in-flight": (R, "in-flight", UNCOUNTED),
    "in-flight-no-hint": (R, "in-flight", UNCOUNTED),
    "store-unavailable": (R, "store-unavailable", UNCOUNTED),
    "dead": (D, "dead-lettered", COUNTED),
    "mismatch": (D, "payload-mismatch", COUNTED),
    "invalid-key": (D, "invalid-id", COUNTED),
    "missing-id": (D, "invalid-id", COUNTED),
    "too-large": (D, "too-large", COUNTED),
    "encoding": (D, "unencodable", COUNTED),
    "recursion": (D, "undecodable", COUNTED),
    "store-error": (R, "store-error", COUNTED),
    "corrupt": (R, "store-error", COUNTED),
    "lease-lost": (R, "lease-lost", COUNTED),
    "publish": (R, "error", COUNTED),
    "config": (R, "error", COUNTED),
    "runtime": (R, "error", COUNTED),
    "value": (R, "error", COUNTED),
    "key": (R, "error", COUNTED),
    "memory": (R, "error", COUNTED),
}


def expected(stage: Stage, kind: str) -> tuple[Action, str | None, bool]:
    if stage is Stage.DECODE:
        return (D, "undecodable", COUNTED)
    if stage is Stage.KEY:
        return (D, "invalid-id", COUNTED)
    if kind == "lease-lost":  # the handler's checkpoint, or the fenced completion
        return (R, "lease-lost", COUNTED)
    if stage is Stage.HANDLER:
        return (A, "cached-error", COUNTED) if kind == "cached" else (R, "handler-error", COUNTED)
    return INBOX[kind]


def judge(exc: BaseException | None, stage: Stage, **kw: object) -> Verdict:
    options: dict[str, object] = {
        "delivery_count": 1,
        "max_deliveries": 10,
        "backoff": BACKOFF,
        "jitter": 0.5,
        "cache_errors": (CachedError,),
    }
    options.update(kw)
    return verdict(exc, stage=stage, **options)  # type: ignore[arg-type]


def test_the_reference_table_covers_every_error_kind() -> None:
    """The table in this test names every example error."""
    assert set(INBOX) == set(ERRORS)


@pytest.mark.parametrize(("stage", "kind"), list(itertools.product(Stage, ERRORS)))
def test_verdict_table(stage: Stage, kind: str) -> None:
    """Every stage and every kind of error gives the action, reason and counting of the table."""
    v = judge(ERRORS[kind], stage)
    assert (v.action, v.reason, v.counted) == expected(stage, kind)
    if v.action is Action.RETRY:
        assert 0 < v.delay <= BACKOFF.cap
    else:
        assert v.delay == 0.0
    if v.action is Action.DEAD_LETTER:
        assert v.error


@pytest.mark.parametrize("stage", list(Stage))
def test_success_is_ack(stage: Stage) -> None:
    """No exception: ACK, whatever the stage and the count."""
    for count in (None, 1, 10, 11, 1000):
        assert judge(None, stage, delivery_count=count) == Verdict(Action.ACK)


@pytest.mark.parametrize("stage", [Stage.HANDLER, Stage.INBOX])
def test_lease_lost_is_handed_back_even_on_the_last_delivery(stage: Stage) -> None:
    """LeaseLost is never a dead letter (which is acked): another worker holds the key."""
    for count in (None, 1, 10, 50):
        v = judge(onceonly.LeaseLost("taken over"), stage, delivery_count=count)
        assert (v.action, v.reason, v.counted) == (Action.RETRY, "lease-lost", True)
        assert 0 < v.delay <= BACKOFF.cap


@pytest.mark.parametrize("stage", [Stage.HANDLER, Stage.INBOX])
def test_counted_retry_on_the_last_allowed_delivery_is_dead_lettered(stage: Stage) -> None:
    """A counted retry at delivery max_deliveries dead-letters at once (reason max-deliveries)."""
    exc = ValueError("bad amount")
    assert judge(exc, stage, delivery_count=9).action is Action.RETRY
    for count in (10, 11, 50):
        v = judge(exc, stage, delivery_count=count)
        assert (v.action, v.reason) == (Action.DEAD_LETTER, "max-deliveries")
        assert v.error == "ValueError: bad amount"


@pytest.mark.parametrize("kind", ["in-flight", "in-flight-no-hint", "store-unavailable"])
def test_transient_errors_never_dead_letter_whatever_the_count(kind: str) -> None:
    """StoreUnavailable and InFlight retry uncounted even far past max_deliveries."""
    for count in (None, 1, 10, 11, 10_000):
        for retries in (0, 1, 5, 100):
            v = judge(ERRORS[kind], Stage.INBOX, delivery_count=count, uncounted_retries=retries)
            assert (v.action, v.counted) == (Action.RETRY, False)


def test_classic_queue_without_count_never_short_circuits() -> None:
    """No delivery count: a counted retry stays a retry (the inbox's attempts end it)."""
    v = judge(ValueError("x"), Stage.HANDLER, delivery_count=None, max_deliveries=1)
    assert (v.action, v.counted) == (Action.RETRY, True)


def test_counted_retry_backs_off_on_the_delivery_count() -> None:
    """The delay doubles with the broker's count, within the jitter's half, up to the cap."""
    for count in range(1, 12):
        low = judge(ValueError(), Stage.HANDLER, delivery_count=count, max_deliveries=99, jitter=0)
        high = judge(
            ValueError(), Stage.HANDLER, delivery_count=count, max_deliveries=99, jitter=0.999
        )
        step = min(BACKOFF.cap, BACKOFF.base * 2 ** (count - 1))
        assert low.delay == pytest.approx(step / 2)
        assert step / 2 <= high.delay <= step


def test_uncounted_retry_backs_off_on_its_own_retries() -> None:
    """A transient retry's delay grows with the retries of this delivery, not the count."""
    exc = onceonly.StoreUnavailable("down")
    delays = [
        judge(exc, Stage.INBOX, delivery_count=1, uncounted_retries=n, jitter=0).delay
        for n in range(8)
    ]
    assert delays == sorted(delays)
    assert delays[0] == pytest.approx(0.05)
    assert delays[-1] == pytest.approx(2.5)


def test_in_flight_honours_retry_after_up_to_the_cap() -> None:
    """InFlight.retry_after lengthens the delay, but never past the cap."""
    short = judge(onceonly.InFlight("x", retry_after=0.0), Stage.INBOX, jitter=0)
    assert short.delay == pytest.approx(0.05)
    longer = judge(onceonly.InFlight("x", retry_after=2.0), Stage.INBOX, jitter=0)
    assert longer.delay == pytest.approx(2.0)
    capped = judge(onceonly.InFlight("x", retry_after=3600.0), Stage.INBOX, jitter=0)
    assert capped.delay == BACKOFF.cap


def test_cached_error_without_cache_errors_is_a_handler_failure() -> None:
    """Without cache_errors, the same exception is an ordinary counted failure."""
    v = judge(CachedError("declined"), Stage.HANDLER, cache_errors=())
    assert (v.action, v.counted) == (Action.RETRY, True)
    v = judge(CachedError("declined"), Stage.INBOX, cache_errors=())
    assert (v.action, v.reason) == (Action.RETRY, "error")


def test_dead_lettered_carries_the_attempts_and_stored_error() -> None:
    """DeadLettered: the dead letter carries its attempts and the record's last error."""
    v = judge(ERRORS["dead"], Stage.INBOX)
    assert (v.attempts, v.error) == (5, "ValueError: bad")


def test_admit() -> None:
    """Past max_deliveries: dead-letter unrun; up to it, or without a count: process."""
    assert admit(None, 1) is None
    assert admit(1, 1) is None
    assert admit(10, 10) is None
    refused = admit(11, 10)
    assert refused is not None
    assert (refused.action, refused.reason) == (Action.DEAD_LETTER, "max-deliveries")
    assert refused.error is not None
    assert "11" in refused.error
    assert "handler was not run" in refused.error


def test_describe_never_raises() -> None:
    """An exception whose __str__ raises is still described."""

    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert describe(Broken()).endswith("Broken: <unprintable>")
    assert describe(ValueError()) == "ValueError"
    v = judge(Broken(), Stage.HANDLER)
    assert v.error is not None
    assert v.error.endswith("Broken: <unprintable>")


def test_header_text_examples() -> None:
    """NUL, CR/LF and other controls become spaces, lone surrogates U+FFFD; long text is cut."""
    assert header_text("a\x00b\r\nc\x85d") == "a b  c d"
    assert header_text("x\ud800y\udfffz") == "x\ufffdy\ufffdz"
    assert header_text("é" * 5, limit=5) == "é" * 5
    assert header_text("é" * 6, limit=5) == "éééé…"
    assert header_text("abc", limit=0) == ""
    assert len(header_text("x" * 100_000)) == MAX_ERROR_CHARS


@given(st.text(alphabet=st.characters(codec=None)), st.integers(min_value=0, max_value=50))
def test_header_text_is_always_safe(text: str, limit: int) -> None:
    """Any text: at most ``limit`` characters, valid UTF-8, no control characters."""
    safe = header_text(text, limit)
    assert len(safe) <= limit
    safe.encode("utf-8")  # no lone surrogates
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in safe)
    if len(text) <= limit and text == header_text(text, limit):
        assert safe == text


@given(st.text(max_size=300))
def test_describe_is_bounded_and_clean(message: str) -> None:
    """An error's description is a safe header value whatever its message."""
    text = describe(ValueError(message + "\x00\ud800"))
    text.encode("utf-8")
    assert "\x00" not in text
    assert len(text) <= MAX_ERROR_CHARS


@pytest.mark.parametrize(
    ("attempts", "max_deliveries", "runs"),
    [(None, 3, True), (0, 3, True), (1, 3, True), (2, 3, False), (5, 3, False), (None, 1, False)],
)
def test_a_delivery_past_max_deliveries_runs_while_the_store_counted_too_few(
    attempts: int | None, max_deliveries: int, runs: bool
) -> None:
    """The broker counts what a dead worker merely held: past max_deliveries, a message
    is poison only once the store counted max_deliveries - 1 attempts of its own."""
    assert still_suspect(attempts, max_deliveries) is runs
