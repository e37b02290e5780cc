# SPDX-License-Identifier: MIT
"""A replay the local tier answers before any session (``ReplayCache``) is the replay the
full claim path gives: the same result, attempt, events and errors, and only where
:func:`~onceonly._core.state.decide` would replay (docs/stores.md, "Cache tiers").

The fast path may only short-cut what the rule answers identically: the core test
compares :func:`replays` with :func:`decide` over generated records; the runner tests
run each case twice, once with the store's replay cache and once without it (the full
path: session, claim, decision), and compare what came out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import onceonly
from onceonly._core.state import Action, Policy, Record, State, decide, replays
from onceonly.events import Event
from onceonly.inbox import _leased
from onceonly.inbox._leased import LeasedRunner
from onceonly.stores.tiered import AsyncTieredStore, LocalTier, TieredStore
from onceonly.stores.tiered._tiers import usable

NOW = 1_000_000.0
_fingerprints = st.one_of(
    st.none(),
    st.sampled_from(["2:aa", "2:bb", "c:aa", "c2:aa", "a" * 64, "b" * 64]),
)
_records = st.builds(
    Record,
    scope=st.just("s"),
    key=st.just("k"),
    state=st.sampled_from(list(State)),
    fingerprint=_fingerprints,
    token=st.sampled_from([1, 2]),
    attempts=st.integers(min_value=0, max_value=4),
    lease_until=st.one_of(st.none(), st.sampled_from([NOW - 1, NOW, NOW + 1])),
    expires_at=st.one_of(st.none(), st.sampled_from([NOW - 1, NOW, NOW + 1e-6, NOW + 60])),
)


@settings(max_examples=2000, deadline=None)
@given(
    _records,
    _fingerprints,
    st.integers(min_value=1, max_value=4),
    st.sampled_from([1, 2, 3]),
)
def test_replays_is_exactly_a_replay_decision(
    record: Record, fingerprint: str | None, max_attempts: int, token: int
) -> None:
    """replays() is true exactly when decide() answers REPLAY, whatever the policy and
    token; a record the tier finds usable is always one of those."""
    decision = decide(record, NOW, fingerprint, Policy(30.0, max_attempts), token)
    assert replays(record, NOW, fingerprint) == (decision.action is Action.REPLAY)
    if usable(record, fingerprint, NOW):
        assert decision.action is Action.REPLAY


class Boom(Exception):
    pass


def _runner(store: Any, *, listeners: list[Event] | None = None) -> LeasedRunner:
    return LeasedRunner(
        store,
        scope="pay",
        ttl=3600,
        cache_errors=(Boom,),
        listeners=[listeners.append] if listeners is not None else (),
    )


def _settle(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", call()
    except onceonly.OnceOnlyError as exc:
        return type(exc).__name__, exc.key
    except Boom as exc:
        return "Boom", str(exc)


def _both(
    prepare: Callable[[TieredStore, LeasedRunner], None],
    call: Callable[[LeasedRunner], Any],
) -> tuple[list[Any], list[Any]]:
    """What ``call`` gives (and which events it emits) with the replay cache, then on a
    fresh store of the same history without it (the full claim path)."""
    seen: list[list[Any]] = []
    for fast in (True, False):
        events: list[Event] = []
        store = TieredStore(onceonly.open_store("memory://"), local=LocalTier(100, 60))
        runner = _runner(store, listeners=events)
        prepare(store, runner)
        if not fast:
            runner._replays = None
        before = store.hits["local"]
        events.clear()
        got = _settle(lambda runner=runner: call(runner))
        kinds = [(e.kind, e.key, e.attempt, e.error, e.ttl, e.lateness is None) for e in events]
        seen.append([got, kinds, store.hits["local"] - before])
    return seen[0], seen[1]


def _done(key: str, result: Any = "paid", fp: str | None = "2:aa") -> Callable[..., None]:
    def prepare(store: TieredStore, runner: LeasedRunner) -> None:
        runner.run(key, fp, lambda: result)

    return prepare


def _raised(key: str) -> Callable[..., None]:
    def prepare(store: TieredStore, runner: LeasedRunner) -> None:
        def fail() -> None:
            raise Boom("declined")

        with pytest.raises(Boom):
            runner.run(key, "2:aa", fail)

    return prepare


@pytest.mark.parametrize(
    ("prepare", "fp", "expected"),
    [
        (_done("k1"), "2:aa", ("ok", ("paid", True, 1))),
        (
            _done("k1", {"id": 7, "items": [1, 2]}),
            "2:aa",
            ("ok", ({"id": 7, "items": [1, 2]}, True, 1)),
        ),
        (_done("k1"), None, ("ok", ("paid", True, 1))),  # arguments not checked
        (_done("k1", fp=None), "2:aa", ("ok", ("paid", True, 1))),  # stored unchecked
        (_done("k1"), "2:bb", ("PayloadMismatch", "k1")),  # decided by the durable store
        (_done("k1"), "c:aa", ("ok", ("paid", True, 1))),  # another scheme: no mismatch
        (_raised("k1"), "2:aa", ("Boom", "declined")),  # a cached error is raised again
        (_done("k2"), "2:aa", ("ok", ("ran", False, 1))),  # another key: it runs
    ],
)
def test_the_cache_answers_as_the_full_path(
    prepare: Callable[..., None], fp: str | None, expected: tuple[str, Any]
) -> None:
    """Result, replayed flag, attempt, errors and events: the same with or without the
    replay cache."""
    fast, full = _both(prepare, lambda r: r.run("k1", fp, lambda: "ran"))
    assert fast == full  # the answer, the events, the local tier's hits
    assert fast[0] == expected
    assert fast[1] or expected[0] != "ok"  # events were compared, not two empty lists


def test_the_cache_answers_process_and_acquire_as_the_full_path() -> None:
    """process() (an Outcome with lateness and ttl) and acquire() (a Replay) agree too."""

    def outcome(r: LeasedRunner) -> Any:
        done = r.process("k1", "2:aa", lambda: "ran")
        return (done.result, done.replayed, done.attempt, done.ttl, done.lateness is not None)

    fast, full = _both(_done("k1"), outcome)
    assert fast[0] == full[0] == ("ok", ("paid", True, 1, 3600.0, True))

    def acquired(r: LeasedRunner) -> Any:
        got = r.acquire("k1", "2:aa")
        assert isinstance(got, _leased.Replay)
        return got.record.result, got.now is not None

    fast, full = _both(_done("k1"), acquired)
    assert fast[0] == full[0] == ("ok", ('"paid"', True))


def test_a_hit_opens_no_session_and_claims_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay from the local tier never reaches the claim loop (no session, no claim
    write, no snapshot, no decision, no Replay object for run())."""
    store = TieredStore(onceonly.open_store("memory://"), local=LocalTier(100, 60))
    runner = _runner(store)
    runner.run("k1", "2:aa", lambda: "paid")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the claim path was taken")

    monkeypatch.setattr(_leased, "claim_key", refuse)
    monkeypatch.setattr(_leased, "Replay", refuse)
    monkeypatch.setattr(store, "session", refuse)
    assert runner.run("k1", "2:aa", lambda: "ran") == ("paid", True, 1)
    assert store.hits["local"] == 1
    with pytest.raises(AssertionError):  # a miss does take it
        runner.run("k2", "2:aa", lambda: "ran")


def test_expiry_and_invalidation_are_misses() -> None:
    """A record expired on the store's clock (as estimated) or forgotten by an operator's
    delete is not answered by the cache: the claim goes to the durable store."""
    store = TieredStore(onceonly.open_store("memory://"), local=LocalTier(100, 60))
    runner = LeasedRunner(store, scope="pay", ttl=60)
    runner.run("k1", None, lambda: "paid")
    assert store.replay("pay", "k1", None) is not None
    store.clock.offset += 61  # the durable store's clock, as last seen, past expires_at
    assert store.replay("pay", "k1", None) is None
    assert len(store.local) == 0  # forgotten, as the full path forgets it
    store.clock.offset = 0.0
    runner.run("k1", None, lambda: "paid")  # replayed by the durable store, cached again
    store.invalidate("pay", "k1")
    assert store.replay("pay", "k1", None) is None


def test_a_noted_key_takes_the_full_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key this runner holds a note for (a claim whose reply was lost) is never
    answered by the cache: the claim acts on the note first."""
    store = TieredStore(onceonly.open_store("memory://"), local=LocalTier(100, 60))
    runner = _runner(store)
    runner.run("k1", "2:aa", lambda: "paid")
    runner._unconfirmed.note("k1", 12345)
    assert runner._cached("k1", "2:aa") is None
    assert runner.run("k1", "2:aa", lambda: "ran") == ("paid", True, 1)
    assert "k1" not in runner._unconfirmed  # the full path used (and dropped) the note


def test_the_decorator_replays_nested_arguments_from_the_cache() -> None:
    """@idempotent on nested arguments: replays from the local tier, and other nested
    arguments under the same key are a mismatch."""
    store = TieredStore(onceonly.open_store("memory://"), local=LocalTier(100, 60))
    runs: list[str] = []

    @onceonly.idempotent(store, key=lambda order: order["id"], scope="orders")
    def charge(order: dict[str, Any]) -> dict[str, Any]:
        runs.append(order["id"])
        return {"paid": order["total"]}

    order = {"id": "o-1", "total": 12.5, "lines": [{"sku": "a", "n": 2}], "note": None}
    assert charge(order) == {"paid": 12.5}
    first = charge(order)
    assert first == {"paid": 12.5} and store.hits["local"] == 1
    first["paid"] = 0  # a replayed value is the caller's own: the next one is fresh
    assert charge(order) == {"paid": 12.5}
    with pytest.raises(onceonly.PayloadMismatch):
        charge({**order, "lines": [{"sku": "a", "n": 3}]})
    assert runs == ["o-1"]


def test_async_replays_from_the_cache() -> None:
    """The async runner takes the same fast path."""

    async def main() -> None:
        durable = onceonly.open_async_store("memory://")
        store = AsyncTieredStore(durable, local=LocalTier(100, 60))
        runs: list[str] = []

        @onceonly.idempotent(store, key=lambda k: k, scope="a")
        async def work(k: str) -> str:
            runs.append(k)
            return k.upper()

        assert [await work("x") for _ in range(3)] == ["X"] * 3
        assert runs == ["x"] and store.hits["local"] == 2
        await store.close()

    asyncio.run(main())
