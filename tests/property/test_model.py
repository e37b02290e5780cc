# SPDX-License-Identifier: MIT
"""Model check (DESIGN §2, §6): a real store and a reference model, driven in lockstep.

A Hypothesis state machine delivers messages through the public surfaces (``Inbox`` in
atomic mode, ``@idempotent`` and the leased runner), simulates crashes (a leased claim
taken and never completed), slow workers (a lease that lapses while the handler runs,
with or without another delivery taking the key over) and the passing of time. After
every step the store's records must equal the model's, every delivery must have
answered what the model predicted (run / replay / mismatch / dead / in flight), and no
handler may have run more often than the model allows.

The model (``reference.py``) is written from DESIGN §2 alone; it does not use
``onceonly._core.state``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

import onceonly
from onceonly._core.fingerprint import fingerprint
from onceonly._core.state import Policy, Record
from onceonly.inbox import Claim, LeasedRunner, Replay
from onceonly.stores.memory import MemoryStore
from onceonly.testing import ManualClock
from tests.conftest import require_mysql, require_postgres
from tests.property.reference import (
    ADVANCES,
    COMPLETED,
    DEAD,
    HARNESSES,
    IN_PROGRESS,
    KEYS,
    LEASE,
    MAX_ATTEMPTS,
    PAYLOADS,
    SCOPE,
    TTL,
    Harness,
    Model,
    Prediction,
    Row,
    check_record,
    payload_of,
)

WAIT = 0.001  # how long a duplicate waits for a live claim before InFlight


class Boom(Exception):
    """The handler failed."""


# `make test` checks a fixed sample (Hypothesis's CI profile derandomizes it); `make soak`
# (ONCEONLY_SOAK=1) checks five times as many histories with fresh seeds.
SOAK = os.environ.get("ONCEONLY_SOAK", "") not in ("", "0")
EXAMPLES = {"memory": 100, "sqlite": 50, "postgres": 20, "pgpart": 20, "mysql": 20}
if SOAK:
    EXAMPLES = {kind: n * 5 for kind, n in EXAMPLES.items()}


# -- the state machine


@dataclasses.dataclass
class Handle:
    """A leased claim whose worker crashed: it is never completed."""

    key: str
    token: int  # the model's token of the claim
    claim: Claim
    checkpoints: dict[str, Any]


@dataclasses.dataclass
class Got:
    value: Any = None
    error: BaseException | None = None


def call(fn: Callable[[], Any]) -> Got:
    try:
        return Got(value=fn())
    except onceonly.OnceOnlyError as exc:
        return Got(error=exc)
    except Boom as exc:
        return Got(error=exc)


class ModelMachine(RuleBasedStateMachine):
    """Drives one store and the model in lockstep."""

    make_harness: ClassVar[Callable[[], Harness]]
    claims = Bundle("claims")

    def __init__(self) -> None:
        super().__init__()
        self.h = type(self).make_harness()
        self.store = self.h.store
        self.model = Model(self.h.start)
        self.runs: Counter[str] = Counter()  # real handler runs, per key
        self.serial = itertools.count(1)
        self.ok = True
        self.real_tokens: dict[str, dict[int, int]] = {k: {} for k in KEYS}
        self.completed_seen: dict[str, tuple[Any, ...]] = {}
        self.inbox = onceonly.Inbox(
            self.store,
            SCOPE,
            ttl=TTL,
            max_attempts=MAX_ATTEMPTS,
            wait=WAIT,
            stale_after=LEASE,
        )
        self.runner = LeasedRunner(
            self.store, scope=SCOPE, policy=Policy(LEASE, MAX_ATTEMPTS), ttl=TTL, wait=WAIT
        )

        @onceonly.idempotent(
            self.store,
            key=lambda key, payload: key,
            scope=SCOPE,  # shares its records with the inbox: one record per key
            fingerprint=lambda key, payload: payload,
            ttl=TTL,
            lease=LEASE,
            max_attempts=MAX_ATTEMPTS,
            wait=WAIT,
        )
        def work(key: str, payload: dict[str, Any]) -> Any:
            return self.effect(key, payload)

        self.work = work
        self.produced: list[Any] = []

    def teardown(self) -> None:
        self.h.close()

    # -- helpers

    def effect(self, key: str, payload: dict[str, Any]) -> Any:
        """The handler's side effect: counted, then fails or returns a unique result."""
        self.runs[key] += 1
        if not self.ok:
            raise Boom(f"{key} failed")
        result = {"key": key, "amount": payload["amount"], "run": next(self.serial)}
        self.produced.append(result)
        return result

    def fp(self, key: str, p: int) -> str:
        return fingerprint(payload_of(key, p))

    def read(self, key: str) -> Record | None:
        with self.store.session() as s:
            record: Record | None = s.get(SCOPE, key).record
            return record

    def move(self, seconds: float) -> None:
        self.model.now += seconds
        self.h.advance(seconds)

    def check_refusal(self, key: str, pred: Prediction, got: Got, surface: str) -> None:
        """A delivery that must not run the handler answered as predicted."""
        row = self.model.current(key)
        if pred.action == "replay":
            assert row is not None
            assert got.error is None, got.error
            if surface == "inbox":
                assert got.value == onceonly.Outcome(row.result, True, key, row.attempt)
            elif surface == "claim":
                assert isinstance(got.value, Replay)
                assert json.loads(got.value.record.result) == row.result
            else:
                assert got.value == row.result
        elif pred.action == "mismatch":
            assert isinstance(got.error, onceonly.PayloadMismatch), got
            assert got.error.key == key
        elif pred.action == "dead":
            assert isinstance(got.error, onceonly.DeadLettered), got
            assert got.error.attempts == pred.attempts
            if pred.parks:
                self.model.park(key, pred)
        else:
            assert pred.action == "in_flight"
            assert isinstance(got.error, onceonly.InFlight), got
            assert got.error.retry_after == pytest.approx(
                pred.retry_after, abs=0 if self.h.exact else 3
            )

    def deliver_on(self, surface: str, key: str, p: int, ok: bool) -> None:
        """Deliver payload ``p`` of ``key`` through ``surface`` and check the answer."""
        pred = self.model.predict(key, p)
        payload = payload_of(key, p)
        runs_before = self.runs[key]
        self.ok, self.produced = ok, []
        if surface == "inbox":
            got = call(lambda: self.inbox.process(key, payload, lambda m, tx: self.effect(key, m)))
        else:
            got = call(lambda: self.work(key, payload))
        self.ok = True
        if pred.action != "run":
            assert self.runs[key] == runs_before, "the handler ran for a " + pred.action
            self.check_refusal(key, pred, got, surface)
            return
        assert self.runs[key] == runs_before + 1
        self.model.runs[key] += 1
        token = self.model.claim(key, p, pred)
        if ok:
            assert got.error is None, got.error
            (result,) = self.produced
            if surface == "inbox":
                assert got.value == onceonly.Outcome(result, False, key, pred.attempt)
            else:
                assert got.value == result
            assert self.model.complete(key, token, result, pred.attempt)
        else:
            assert isinstance(got.error, Boom), got
            self.model.fail(key, token, payload if surface == "inbox" else None)

    # -- rules

    @rule(key=st.sampled_from(KEYS), p=PAYLOADS, ok=st.booleans())
    def deliver(self, key: str, p: int, ok: bool) -> None:
        """A message arrives at the inbox (atomic mode)."""
        self.deliver_on("inbox", key, p, ok)

    @rule(key=st.sampled_from(KEYS), p=PAYLOADS, ok=st.booleans())
    def call_idempotent(self, key: str, p: int, ok: bool) -> None:
        """A call of an @idempotent function (leased mode) with the same key."""
        self.deliver_on("leased", key, p, ok)

    @rule(target=claims, key=st.sampled_from(KEYS), p=PAYLOADS)
    def crash_after_claim(self, key: str, p: int) -> Any:
        """A worker takes a leased claim and dies before completing it."""
        pred = self.model.predict(key, p)
        got = call(lambda: self.runner.claim(key, self.fp(key, p)))
        if pred.action != "run":
            self.check_refusal(key, pred, got, "claim")
            return multiple()
        assert got.error is None, got.error
        claim = got.value
        assert isinstance(claim, Claim)
        assert claim.attempt == pred.attempt
        assert claim.checkpoints == pred.carried
        token = self.model.claim(key, p, pred)
        assert claim.token not in self.real_tokens[key].values(), "a fencing token was reused"
        self.real_tokens[key][token] = claim.token
        return Handle(key, token, claim, dict(pred.carried))

    @rule(handle=claims, step=st.sampled_from(("charged", "emailed")), data=st.integers(0, 9))
    def checkpoint_from_stale_claim(self, handle: Handle, step: str, data: int) -> None:
        """A crashed worker's claim saves a checkpoint: fenced by its token."""
        row = self.model.rows.get(handle.key)
        holds = row is not None and row.state == IN_PROGRESS and row.token == handle.token
        got = call(lambda: handle.claim.checkpoint(step, data))
        if holds:
            assert row is not None
            assert got.error is None, got.error
            handle.checkpoints[step] = data
            row.checkpoint = dict(handle.checkpoints)
            row.lease_until = self.model.now + LEASE  # a checkpoint renews the lease
        else:
            assert isinstance(got.error, onceonly.LeaseLost), got

    @rule(seconds=st.sampled_from(ADVANCES))
    def advance(self, seconds: float) -> None:
        """Time passes (past a lease, or past the ttl of completed keys)."""
        self.move(seconds)

    @rule(
        key=st.sampled_from(KEYS),
        p=PAYLOADS,
        redeliver=st.sampled_from((None, "inbox", "leased")),
    )
    def slow_worker(self, key: str, p: int, redeliver: str | None) -> None:
        """A leased handler outlives its lease; maybe another delivery takes the key over.

        The slow worker's completion must then fail with LeaseLost and never overwrite
        what the other delivery stored.
        """
        pred = self.model.predict(key, p)
        if pred.action != "run":
            self.deliver_on("leased", key, p, True)
            return
        token = self.model.claim(key, p, pred)
        self.model.runs[key] += 1
        produced: list[Any] = []

        def slow() -> Any:
            self.runs[key] += 1
            self.move(LEASE + 1)  # no heartbeat: the manual clock outruns it
            if redeliver is not None:
                self.deliver_on(redeliver, key, p, True)
            result = {"key": key, "slow": next(self.serial)}
            produced.append(result)
            return result

        runs_before = self.runs[key]
        got = call(lambda: self.runner.run(key, self.fp(key, p), slow, payload_of(key, p)))
        assert self.runs[key] > runs_before
        (result,) = produced
        if self.model.complete(key, token, result, pred.attempt):
            assert got.error is None, got.error
            assert got.value == (result, False, pred.attempt)
        else:
            assert isinstance(got.error, onceonly.LeaseLost), got

    # -- invariants

    @invariant()
    def handlers_ran_as_allowed(self) -> None:
        """Each key's handler ran exactly as often as the model allows; one success per life."""
        assert self.runs == self.model.runs
        assert all(n <= 1 for n in self.model.completions.values())

    @invariant()
    def store_matches_model(self) -> None:
        """Every stored record equals the model's: state, fingerprint, attempts, result…"""
        for key in KEYS:
            real = self.read(key)
            row = self.model.rows.get(key)
            check_record(key, row, real, exact=self.h.exact)
            if row is not None:
                assert real is not None
                self.check_token(key, row, real)

    def check_token(self, key: str, row: Row, real: Record) -> None:
        """The fencing token changes with every claim taken, and only then."""
        seen = self.real_tokens[key]
        if row.token in seen:
            assert real.token == seen[row.token], "the token changed without a new claim"
        else:
            assert real.token not in seen.values(), "a new claim reused an old token"
            seen[row.token] = real.token

    @invariant()
    def completed_is_never_overwritten(self) -> None:
        """A completed, unexpired record keeps its token, result and completion time."""
        for key in KEYS:
            row = self.model.current(key)
            if row is None or row.state != COMPLETED:
                self.completed_seen.pop(key, None)
                continue
            real = self.read(key)
            assert real is not None
            now: tuple[Any, ...] = (real.token, real.result)
            if self.h.exact:  # time travel on PostgreSQL moves the stored times
                now += (real.completed_at, real.expires_at)
            assert self.completed_seen.setdefault(key, now) == now


@pytest.fixture(params=list(HARNESSES))
def harness_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Harness]:
    kind = request.param
    if kind in ("postgres", "pgpart"):
        require_postgres()  # unreachable server: skip locally, FAIL in CI
    if kind == "mysql":
        require_mysql()
    return lambda: HARNESSES[kind](tmp_path)


def test_store_agrees_with_the_model(
    harness_factory: Callable[[], Harness], request: pytest.FixtureRequest
) -> None:
    """Random delivery histories leave the store and the DESIGN §2 model in agreement."""
    kind = request.node.callspec.params["harness_factory"]
    machine = type(f"ModelMachine_{kind}", (ModelMachine,), {"make_harness": harness_factory})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=EXAMPLES[kind],
            stateful_step_count=40,
            deadline=None,
            **({"derandomize": False} if SOAK else {}),  # a soak explores fresh seeds
        ),
    )


# -- regressions: bugs this machine found, pinned as plain tests.


@contextlib.contextmanager
def memory_and_runner(max_attempts: int) -> Iterator[tuple[MemoryStore, ManualClock, Any]]:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    runner = LeasedRunner(
        store, scope=SCOPE, policy=Policy(LEASE, max_attempts), ttl=TTL, wait=WAIT
    )
    yield store, clock, runner


def test_inbox_persists_dead_for_a_lapsed_last_claim() -> None:
    """The inbox's DeadLettered for a lapsed last claim leaves the record dead."""
    payload = payload_of("k", 0)
    with memory_and_runner(2) as (store, clock, runner):
        inbox = onceonly.Inbox(store, SCOPE, max_attempts=2, stale_after=LEASE, wait=WAIT)
        runner.claim("k", fingerprint(payload))  # a worker claims and dies
        clock.advance(LEASE + 1)
        runner.claim("k", fingerprint(payload))  # attempt 2 claims and dies
        clock.advance(LEASE + 1)
        with pytest.raises(onceonly.DeadLettered):
            inbox.process("k", payload, lambda m, tx: "ran")
        with store.session() as s:
            record = s.get(SCOPE, "k").record
        assert record is not None
        assert record.state.value == DEAD


def test_a_dead_lettered_claim_cannot_complete() -> None:
    """A worker whose lapsed claim was dead-lettered gets LeaseLost, and the record stays dead."""
    fp = fingerprint(payload_of("k", 0))
    with memory_and_runner(1) as (store, clock, runner):

        def slow() -> str:
            clock.advance(LEASE + 1)
            with pytest.raises(onceonly.DeadLettered):
                runner.claim("k", fp)  # another delivery: the lapsed run was the last
            return "late"

        with pytest.raises(onceonly.LeaseLost):
            runner.run("k", fp, slow)
        with store.session() as s:
            record = s.get(SCOPE, "k").record
        assert record is not None
        assert record.state.value == DEAD
