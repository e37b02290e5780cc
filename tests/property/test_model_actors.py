# SPDX-License-Identifier: MIT
"""Model check with several actors (DESIGN §2 "every write is conditional on the exact
version it decided from", §6).

Two to four workers interleave **single store operations**, mostly on one contended
key, on a clock that moves only when a step says so. A worker is an actor with a local
view: either a decision it computed from what it read, kept pending and possibly stale
by the time it is stored, or a claim it holds (its record and token, its checkpoints and
the lease it believes it has). Each step is one operation of one worker:

* ``pending_N = read(key, p)``: a free worker calls ``session.claim`` (insert-or-get).
  An insert is a claim already stored (``apply`` just hands it over); any other record
  goes through ``decide`` and the write it asks for, with its ``Expect``, waits in
  ``pending_N``.
* ``claim_N = apply(pending)``: the pending write, ``session.update(scope, key, expect,
  write)`` in an autocommit session (leased mode); a claim taken is held as ``claim_N``.
* ``apply_atomic(pending)``: the same decision stored as the inbox does in atomic mode:
  the claim written as completed and its result stored, in one ``store.transaction()``.
* ``renew(claim)``, ``checkpoint(claim, step, data)`` (which renews too),
  ``complete(claim)``, ``fail(claim)``: the holder's fenced writes (``Expect.holder``).
  A holder that stops renewing is a stalled or crashed worker.
* ``advance(seconds)``: the store's clock moves (past a lease, past the ttl).

The reference model (``reference.py``, written from DESIGN §2) says whether each write
must be taken given the model's record **as it is now**: the same claim (token), the
same state and, for a decision that relied on time having passed (a lapsed lease, an
expired completion), that it still has on the clock now. After every step:

* the store's records equal the model's (state, token, attempts, fingerprint, result,
  checkpoint, error; lease and expiry times where the clock is exact);
* a completed, unexpired record is never overwritten;
* at most one worker holds a claim the store would let it complete, and a worker whose
  lease is live (by its own reckoning) still holds its claim;
* each key is completed (an effect) at most once per life: per generation.

Transactions interleave with the other steps only between transactions: SQLite's
``BEGIN IMMEDIATE`` serialises whole transactions, and a PostgreSQL transaction holding
a row would block the next worker's claim of it in this single thread.

``ONCEONLY_SOAK=1`` (``make soak``) runs at least ``ONCEONLY_SOAK_STEPS`` (10,000) steps
per store and prints what ran.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import Phase, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from onceonly._core import codec
from onceonly._core.fingerprint import fingerprint
from onceonly._core.state import (
    Action,
    Decision,
    Expect,
    Policy,
    Record,
    State,
    claim_write,
    complete_write,
    decide,
    fail_write,
)
from onceonly._runtime import new_token
from tests.conftest import require_mysql, require_postgres, require_redis
from tests.property.reference import (
    ADVANCES,
    COMPLETED,
    IN_PROGRESS,
    KEYS,
    LEASE,
    LEASED_HARNESSES,
    MAX_ATTEMPTS,
    SCOPE,
    TTL,
    Harness,
    Model,
    Prediction,
    Row,
    check_record,
    payload_of,
)

WORKERS = 4  # at most; each history starts with 2 to 4
SOAK = os.environ.get("ONCEONLY_SOAK", "") not in ("", "0")
SOAK_STEPS = int(os.environ.get("ONCEONLY_SOAK_STEPS", "10000"))
# Histories per store and steps per history: in `make test` a fixed sample (Hypothesis's
# CI profile derandomizes it), about 2 min for the six stores on a quiet 2-core machine
# (a history runs ~30 steps on average); the steered races are also pinned as plain tests
# below. `make soak` runs longer histories in rounds (each
# with its own seed) until SOAK_STEPS steps have run and every race in RACES was met,
# or SOAK_ROUNDS rounds.
SOAK_ROUNDS = 10
if SOAK:
    EXAMPLES = {
        "memory": 1500,
        "sqlite": 1000,
        "postgres": 400,
        "pgpart": 400,
        "redis": 1000,
        "mysql": 400,
    }
    STEPS_PER_EXAMPLE = 60
else:
    EXAMPLES = {
        "memory": 120,
        "sqlite": 100,
        "postgres": 80,
        "pgpart": 50,
        "redis": 100,
        "mysql": 50,
    }
    STEPS_PER_EXAMPLE = 40
POLICY = Policy(LEASE, MAX_ATTEMPTS)
# Without the "explain" phase: it traces every line (slow before Python 3.12) only to
# annotate a counterexample that is already short.
PHASES = tuple(phase for phase in Phase if phase is not Phase.explain)
# Mostly the first key: workers contend for it; the second checks that keys stay apart.
CONTENDED = st.sampled_from((KEYS[0], KEYS[0], KEYS[1], KEYS[0], KEYS[0]))
# Mostly the same payload: a mismatch is checked, but decides nothing.
# (The 1 is not last: Hypothesis draws the ends of a range more often than the middle.)
SAME_PAYLOAD = st.sampled_from((0, 0, 0, 0, 1, 0, 0, 0))
NEVER = -math.inf
# The steps of time of ``reference.ADVANCES`` (whole seconds, so that a live lease or
# record keeps >= 7 s in the model: room for PostgreSQL's real clock to move), lapsing a
# lease first: a counterexample shrinks towards the first.
WAITS = (LEASE + 1, 10.0, TTL + 1)
assert set(WAITS) == set(ADVANCES)
# The races the search is steered towards (``hypothesis.target``): a decision stored after
# the record changed under it in one of these ways (a new token is common anyway).
RACES = ("lease renewed", "now completed", "now failed", "now dead")


def fp_of(key: str, p: int) -> str:
    return fingerprint(payload_of(key, p))


@dataclasses.dataclass(eq=False)
class Held:
    """A claim a worker holds (as far as it knows)."""

    worker: int
    key: str
    p: int
    record: Record  # the claim as the store returned it: its token, attempts…
    mtoken: int  # the model's name of that token
    attempt: int
    checkpoints: dict[str, Any]
    live_until: float  # model time up to which the worker believes its lease is live


@dataclasses.dataclass(eq=False)
class Pending:
    """A decision a worker computed from what it read, not yet stored."""

    worker: int
    key: str
    p: int
    decision: Decision
    pred: Prediction  # what the model predicted from the same read
    read: Row | None  # the model's row when the worker read it (a copy)
    inserted: Held | None = None  # the read inserted the claim: already stored


# What ran, per store (printed by the soak): steps, histories, steps and outcomes by kind.
STEPS: Counter[str] = Counter()
RUNS: Counter[str] = Counter()
EVENTS: dict[str, Counter[str]] = {name: Counter() for name in LEASED_HARNESSES}
RACED: dict[str, Counter[str]] = {name: Counter() for name in LEASED_HARNESSES}


class ActorsMachine(RuleBasedStateMachine):
    """Several workers on one store and the model, in lockstep."""

    kind: ClassVar[str]
    make_harness: ClassVar[Callable[[], Harness]]
    pendings = Bundle("pending")
    claims = Bundle("claim")

    def __init__(self) -> None:
        super().__init__()
        self.h = type(self).make_harness()
        self.store = self.h.store
        self.model = Model(self.h.start)
        self.workers = 0
        self.busy: dict[int, Pending | Held] = {}  # worker -> what it is doing
        self.real: dict[int, int] = {}  # model token -> the fencing token the store holds
        self.effects: Counter[tuple[str, int]] = Counter()  # completions the store took
        self.completed_seen: dict[str, tuple[Any, ...]] = {}
        self.serial = itertools.count(1)
        self.races: Counter[str] = Counter()  # stale writers that met a changed record
        RUNS[self.kind] += 1

    def teardown(self) -> None:
        self.h.close()
        # steer the search towards histories where stale writers meet changed records
        for race in RACES:
            target(float(self.races[race]), label=f"stale decision refused: {race}")

    @initialize(workers=st.integers(2, WORKERS))
    def start(self, workers: int) -> None:
        """How many workers this history has."""
        self.workers = workers

    # -- the model's answers

    def changed(self, pending: Pending) -> str | None:
        """How the record changed since the decision was read (``None``: it is still that
        version, so the write must be taken): the same claim (token), the same state, and
        a lapse the decision relied on has still happened on the clock now."""
        row, read = self.model.rows.get(pending.key), pending.read
        assert read is not None
        if row is None:
            return "gone"
        if row.token != read.token:
            return "new token"
        if row.state != read.state:
            return f"now {row.state}"
        if read.state == IN_PROGRESS:
            assert row.lease_until is not None
            return None if row.lease_until <= self.model.now else "lease renewed"
        if read.state == COMPLETED:
            assert row.expires_at is not None
            return None if row.expires_at <= self.model.now else "unexpired"
        return None

    def waiting_matters(self) -> bool:
        """Whether the clock moving would change a record (a lease or expiry to pass)."""
        now = self.model.now
        return any(
            (row.lease_until is not None and row.lease_until > now)
            or (row.state == COMPLETED and row.expires_at is not None and row.expires_at > now)
            for row in self.model.rows.values()
        )

    def holds(self, held: Held) -> bool:
        """Is ``held`` still the key's claim (one the store would let it complete)?"""
        row = self.model.rows.get(held.key)
        return row is not None and row.state == IN_PROGRESS and row.token == held.mtoken

    # -- helpers

    def done(self, what: str) -> None:
        """Count a step (for the soak's report), then check the invariants (not as an
        ``@invariant``, so that counterexamples list only the steps)."""
        STEPS[self.kind] += 1
        EVENTS[self.kind][what] += 1
        self.check()

    def stored(self, step: str, pending: Pending, why: str | None) -> None:
        """Count what a stored decision met (printed by the soak)."""
        assert pending.read is not None
        what = {COMPLETED: "an expired completion", IN_PROGRESS: "a lapsed lease"}.get(
            pending.read.state, pending.read.state
        )
        refused = "" if why is None else f", refused ({why})"
        if why in RACES:
            self.races[why] += 1
            RACED[self.kind][why] += 1
        EVENTS[self.kind][f"{step}: {pending.decision.action.value} over {what}{refused}"] += 1

    def outcome(self, step: str, held: Held, taken: bool) -> None:
        """Count a holder's write and whether the store took it (printed by the soak)."""
        lapsed = " after its lease lapsed" if held.live_until <= self.model.now else ""
        EVENTS[self.kind][f"{step}{lapsed}: {'taken' if taken else 'refused'}"] += 1

    def brief(self, row: Row | None) -> str:
        """A model row in a few words, times relative to the start (t=0)."""
        if row is None:
            return "absent"
        words = [row.state, f"claim #{row.token}", f"attempts {row.attempts}"]
        if row.lease_until is not None:
            words.append(f"lease until t={row.lease_until - self.h.start:g}")
        if row.expires_at is not None:
            words.append(f"expires at t={row.expires_at - self.h.start:g}")
        return ", ".join(words)

    def disagree(self, pending: Pending, took: bool) -> str:
        """Why the store's answer to a pending write is wrong, in the model's words."""
        d = pending.decision
        assert d.expect is not None
        lapsed = " (lapsed)" if d.expect.lapsed else ""
        return (
            f"the store {'took' if took else 'refused'} a {d.action.value} decided from "
            f"[{self.brief(pending.read)}] expecting {d.expect.state.value}{lapsed}; at "
            f"t={self.model.now - self.h.start:g} the record is "
            f"[{self.brief(self.model.rows.get(pending.key))}]"
        )

    def holder_disagrees(self, step: str, claim: Held, took: bool) -> str:
        """Why the store's answer to a holder's write is wrong, in the model's words."""
        row = self.model.rows.get(claim.key)
        return (
            f"the store {'took' if took else 'refused'} the {step} of claim #{claim.mtoken} "
            f"at t={self.model.now - self.h.start:g}; the record is [{self.brief(row)}]"
        )

    def name(self, mtoken: int, token: int) -> None:
        """The model's token ``mtoken`` is the store's ``token`` (never an old one)."""
        assert token not in self.real.values(), "a fencing token was reused"
        self.real[mtoken] = token

    def take(self, pending: Pending, record: Record) -> Held:
        """The model takes the claim ``pending`` decided; the worker holds it."""
        assert pending.decision.write is not None
        mtoken = self.model.claim(pending.key, pending.p, pending.pred)
        self.name(mtoken, pending.decision.write.token)
        held = Held(
            pending.worker,
            pending.key,
            pending.p,
            record,
            mtoken,
            pending.pred.attempt,
            dict(self.model.rows[pending.key].checkpoint),  # as kept by the store
            self.model.now + LEASE,
        )
        self.busy[held.worker] = held
        return held

    def renewed(self, held: Held) -> None:
        row = self.model.rows[held.key]
        row.lease_until = held.live_until = self.model.now + LEASE

    # -- the steps

    @precondition(lambda self: len(self.busy) < self.workers)
    @rule(target=pendings, key=CONTENDED, p=SAME_PAYLOAD)
    def read(self, key: str, p: int) -> Any:
        """A free worker claims (insert-or-get) and decides; the write stays pending."""
        worker = min(set(range(self.workers)) - set(self.busy))
        read = self.model.rows.get(key)
        pred = self.model.predict(key, p)
        token, fp = new_token(), fp_of(key, p)
        intent = claim_write(fp, token, POLICY)
        with self.store.session() as s:
            snap = s.claim(SCOPE, key, intent)
        if snap.inserted:
            assert read is None, f"a claim was inserted over {read}"
            assert snap.record is not None
            decision = Decision(Action.RUN, None, intent, attempt=1)
            pending = Pending(worker, key, p, decision, pred, None)
            pending.inserted = self.take(pending, snap.record)
            self.done("read: inserted")
            return pending
        assert read is not None, f"the store has {snap.record}, the model nothing"
        decision = decide(snap.record, snap.now, fp, POLICY, token)
        assert decision.action.value == pred.action, (decision, pred)
        if pred.action == "replay":
            current = self.model.current(key)
            assert current is not None and snap.record is not None
            assert snap.record.result is not None
            assert json.loads(snap.record.result) == current.result
        elif pred.action == "in_flight":
            assert decision.retry_after == pytest.approx(
                pred.retry_after, abs=0 if self.h.exact else 3
            )
        if decision.write is None:
            assert not pred.parks and pred.action != "run", (decision, pred)
            self.done(f"read: {pred.action}")
            return multiple()
        assert pred.action == "run" or pred.parks, (decision, pred)
        assert decision.write.attempts == pred.attempts, (decision, pred)
        if pred.action == "run":
            assert decision.attempt == pred.attempt, (decision, pred)
            carried = json.loads(decision.write.checkpoint) if decision.write.checkpoint else {}
            assert carried == pred.carried, (decision, pred)
        pending = Pending(worker, key, p, decision, pred, dataclasses.replace(read))
        self.busy[worker] = pending
        self.done(f"read: {pred.action}")
        return pending

    @rule(target=claims, pending=consumes(pendings))
    def apply(self, pending: Pending) -> Any:
        """The worker stores its pending (maybe stale) decision in autocommit (leased)."""
        if pending.inserted is not None:
            self.done("apply: inserted already")
            return pending.inserted
        del self.busy[pending.worker]
        d, key = pending.decision, pending.key
        assert d.write is not None and d.expect is not None
        why = self.changed(pending)
        with self.store.session() as s:
            got = s.update(SCOPE, key, d.expect, d.write)
        self.stored("apply", pending, why)
        took, must = got is not None, why is None
        assert took == must, self.disagree(pending, took)
        result: Any = multiple()
        if got is not None and d.action is Action.DEAD:
            self.model.park(key, pending.pred)
            self.name(self.model.rows[key].token, d.write.token)
        elif got is not None:
            result = self.take(pending, got)
        self.done("apply")
        return result

    @precondition(lambda self: self.store.atomic)  # Redis has no atomic mode
    @rule(target=claims, pending=consumes(pendings))
    def apply_atomic(self, pending: Pending) -> Any:
        """The worker stores its pending decision as atomic mode does: a claim, its
        handler and its completion in one transaction (written as completed, then the
        result); a dead state in a transaction of its own."""
        if pending.inserted is not None:  # the claim is stored already, in autocommit
            self.done("apply_atomic: inserted already")
            return pending.inserted
        del self.busy[pending.worker]
        d, key = pending.decision, pending.key
        assert d.write is not None and d.expect is not None
        why = self.changed(pending)
        result = {"key": key, "atomic": next(self.serial)}
        if d.action is Action.RUN:
            write = dataclasses.replace(
                d.write,
                state=State.COMPLETED,
                lease_seconds=None,
                checkpoint=None,
                keep_checkpoint=False,
                payload=None,
                ttl_seconds=TTL,
                completed=True,
            )
        else:
            write = d.write
        with self.store.transaction() as tx:
            got = tx.update(SCOPE, key, d.expect, write)
            if got is not None and d.action is Action.RUN:
                done = tx.update(
                    SCOPE,
                    key,
                    Expect(got.token, State.COMPLETED),
                    complete_write(got, codec.encode(result), TTL),
                )
                assert done is not None, "the claim changed inside its own transaction"
        self.stored("apply_atomic", pending, why)
        took, must = got is not None, why is None
        assert took == must, self.disagree(pending, took)
        if got is not None and d.action is Action.DEAD:
            self.model.park(key, pending.pred)
            self.name(self.model.rows[key].token, d.write.token)
        elif got is not None:
            held = self.take(pending, got)
            del self.busy[held.worker]
            assert self.model.complete(key, held.mtoken, result, held.attempt)
            self.effects[key, self.model.rows[key].generation] += 1
        self.done("apply_atomic")
        return multiple()

    @rule(claim=claims)
    def renew(self, claim: Held) -> None:
        """The holder renews its lease."""
        must = self.holds(claim)
        with self.store.session() as s:
            until = s.renew(SCOPE, claim.key, claim.record.token, LEASE)
        self.outcome("renew", claim, must)
        took = until is not None
        assert took == must, self.holder_disagrees("renew", claim, took)
        if until is None:
            claim.live_until = NEVER  # the worker knows it lost the claim
        else:
            self.renewed(claim)
            if self.h.exact:
                assert until == self.model.rows[claim.key].lease_until
        self.done("renew")

    @rule(claim=claims, step=st.sampled_from(("charged", "emailed")), data=st.integers(0, 9))
    def checkpoint(self, claim: Held, step: str, data: int) -> None:
        """The holder saves a checkpoint, which renews its lease too."""
        must = self.holds(claim)
        updated = {**claim.checkpoints, step: data}
        text = codec.encode(updated, what="checkpoint")
        with self.store.session() as s:
            ok = s.save_checkpoint(SCOPE, claim.key, claim.record.token, text, LEASE)
        self.outcome("checkpoint", claim, must)
        assert ok == must, self.holder_disagrees("checkpoint", claim, ok)
        if not ok:
            claim.live_until = NEVER
        else:
            claim.checkpoints = updated
            self.model.rows[claim.key].checkpoint = dict(updated)
            self.renewed(claim)
        self.done("checkpoint")

    @rule(claim=consumes(claims))
    def complete(self, claim: Held) -> None:
        """The holder stores its result (the effect happened)."""
        del self.busy[claim.worker]
        must = self.holds(claim)
        result = {"key": claim.key, "run": next(self.serial)}
        write = complete_write(claim.record, codec.encode(result), TTL)
        with self.store.session() as s:
            got = s.update(SCOPE, claim.key, Expect.holder(claim.record.token), write)
        self.outcome("complete", claim, must)
        took = got is not None
        assert took == must, self.holder_disagrees("complete", claim, took)
        assert self.model.complete(claim.key, claim.mtoken, result, claim.attempt) == took
        if got is not None:
            self.effects[claim.key, self.model.rows[claim.key].generation] += 1
        self.done("complete")

    @rule(claim=consumes(claims))
    def fail(self, claim: Held) -> None:
        """The holder records a failed attempt."""
        del self.busy[claim.worker]
        must = self.holds(claim)
        payload = payload_of(claim.key, claim.p)
        checkpoint = codec.encode(claim.checkpoints) if claim.checkpoints else None
        write = fail_write(
            dataclasses.replace(claim.record, checkpoint=checkpoint),
            claim.record.fingerprint,
            claim.record.token,
            "Boom: the handler failed",
            codec.encode(payload),
            MAX_ATTEMPTS,
        )
        with self.store.session() as s:
            got = s.update(SCOPE, claim.key, Expect.holder(claim.record.token), write)
        self.outcome("fail", claim, must)
        took = got is not None
        assert took == must, self.holder_disagrees("fail", claim, took)
        if got is not None:
            self.model.fail(claim.key, claim.mtoken, payload)
        self.done("fail")

    # Only while waiting can change something (a live lease or an unexpired completion):
    # a history whose other steps are all switched off (Hypothesis's swarm testing) is
    # then dropped instead of being padded with waiting.
    @precondition(lambda self: self.waiting_matters())
    @rule(seconds=st.sampled_from(WAITS))
    def advance(self, seconds: float) -> None:
        """Time passes on the store's clock (past a lease, or past the ttl)."""
        self.model.now += seconds
        self.h.advance(seconds)
        self.done("advance")

    # -- invariants, after every step (one read of each key)

    def check(self) -> None:
        """The records equal the model's; completions are kept; one holder; one effect."""
        for key in KEYS:
            with self.store.session() as s:
                real = s.get(SCOPE, key).record
            row = self.model.rows.get(key)
            check_record(key, row, real, exact=self.h.exact)
            if row is not None:
                assert real is not None
                assert real.token == self.real[row.token], "the token is not the claim's"
            self.check_completed_kept(key, real)
            self.check_holders(key, real)
        assert all(n <= 1 for n in self.effects.values()), f"double effect: {self.effects}"

    def check_completed_kept(self, key: str, real: Record | None) -> None:
        """A completed, unexpired record keeps its token, result and completion time."""
        row = self.model.current(key)
        if row is None or row.state != COMPLETED:
            self.completed_seen.pop(key, None)
            return
        assert real is not None
        now: tuple[Any, ...] = (real.token, real.result)
        if self.h.exact:  # time travel on PostgreSQL moves the stored times
            now += (real.completed_at, real.expires_at)
        assert self.completed_seen.setdefault(key, now) == now, "a completion was overwritten"

    def check_holders(self, key: str, real: Record | None) -> None:
        """At most one worker could complete ``key``; a live lease is never lost."""
        held = [h for h in self.busy.values() if isinstance(h, Held) and h.key == key]
        able = [
            h.worker
            for h in held
            if real is not None and real.state is State.IN_PROGRESS and real.token == h.record.token
        ]
        assert len(able) <= 1, f"workers {able} could all complete {key}"
        for h in held:
            if h.live_until > self.model.now:
                assert able == [h.worker], f"worker {h.worker} lost {key} while its lease was live"


@pytest.fixture(params=list(LEASED_HARNESSES))
def kind(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name in ("postgres", "pgpart"):
        require_postgres()  # unreachable server: skip locally, FAIL in CI
    if name == "redis":
        require_redis()
    if name == "mysql":
        require_mysql()
    return name


@pytest.fixture
def fresh_harness(kind: str, tmp_path: Path) -> Iterator[Callable[[], Harness]]:
    """A harness per history: the SQL stores' are one table per test, emptied for each
    history (creating a table, and for PostgreSQL a pool, each time slows shrinking)."""
    if kind == "memory":
        yield lambda: LEASED_HARNESSES[kind](tmp_path)
        return
    shared = LEASED_HARNESSES[kind](tmp_path)
    assert shared.empty is not None
    empty = shared.empty

    def fresh() -> Harness:
        empty()
        start = shared.store.clock() if shared.exact else shared.start  # the clock moved on
        return dataclasses.replace(shared, start=start, close=lambda: None)

    yield fresh
    shared.close()


@pytest.mark.timeout(0 if SOAK else 300)  # a failure shrinks on PostgreSQL in ~2 min
def test_interleaved_workers_agree_with_the_model(
    kind: str, fresh_harness: Callable[[], Harness], capsys: pytest.CaptureFixture[str]
) -> None:
    """2-4 workers interleaving store operations leave the store and the model agreeing."""
    machine = type(
        f"ActorsMachine_{kind}",
        (ActorsMachine,),
        {"kind": kind, "make_harness": staticmethod(fresh_harness)},
    )
    STEPS[kind] = RUNS[kind] = 0
    EVENTS[kind].clear()
    RACED[kind].clear()
    started = time.monotonic()
    for rounds in itertools.count(1):
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=EXAMPLES[kind],
                stateful_step_count=STEPS_PER_EXAMPLE,
                deadline=None,
                report_multiple_bugs=False,
                phases=PHASES,
                # a soak explores: never the fixed seed of Hypothesis's CI profile
                # (loaded whenever CI is set, even empty, as `make` does)
                **({"derandomize": False} if SOAK else {}),
            ),
        )
        if not SOAK or rounds >= SOAK_ROUNDS:
            break
        if STEPS[kind] >= SOAK_STEPS and all(RACED[kind][race] for race in RACES):
            break
    if SOAK:
        with capsys.disabled():
            missed = [race for race in RACES if not RACED[kind][race]]
            print(
                f"\n{kind}: {STEPS[kind]} steps in {RUNS[kind]} histories ({rounds} rounds), "
                f"{time.monotonic() - started:.1f} s; races never met: {missed or 'none'}"
            )
            for what, n in sorted(EVENTS[kind].items()):
                print(f"  {n:6d}  {what}")


# -- the races above, pinned on every store as plain tests


@pytest.fixture
def harness(kind: str, tmp_path: Path) -> Iterator[Harness]:
    h = LEASED_HARNESSES[kind](tmp_path)
    yield h
    h.close()


def worker_reads(h: Harness) -> Decision:
    """A worker claims ``k`` (insert-or-get) and decides from what it read."""
    token = new_token()
    with h.store.session() as s:
        snap = s.claim(SCOPE, "k", claim_write(fp_of("k", 0), token, POLICY))
    assert not snap.inserted
    return decide(snap.record, snap.now, fp_of("k", 0), POLICY, token)


def first_claim(h: Harness) -> Record:
    """A worker takes the first claim of ``k``."""
    with h.store.session() as s:
        snap = s.claim(SCOPE, "k", claim_write(fp_of("k", 0), new_token(), POLICY))
    assert snap.inserted and snap.record is not None
    return snap.record


def holder_writes(h: Harness, claim: Record, write: str) -> None:
    """The holder of ``claim`` completes, fails, renews or saves a checkpoint."""
    token = claim.token
    with h.store.session() as s:
        if write == "complete":
            done = s.update(SCOPE, "k", Expect.holder(token), complete_write(claim, "1", TTL))
            assert done is not None
        elif write == "fail":
            failed = fail_write(claim, claim.fingerprint, token, "Boom", None, MAX_ATTEMPTS)
            assert s.update(SCOPE, "k", Expect.holder(token), failed) is not None
        elif write == "renew":
            assert s.renew(SCOPE, "k", token, LEASE) is not None
        else:
            text = codec.encode({"charged": 1}, what="checkpoint")
            assert s.save_checkpoint(SCOPE, "k", token, text, LEASE)


@pytest.mark.parametrize("write", ["complete", "fail", "renew", "checkpoint"])
def test_a_takeover_decided_before_the_holders_write_is_refused(
    harness: Harness, write: str
) -> None:
    """A takeover decided from a lapsed lease fails once the holder wrote (same token)."""
    claim = first_claim(harness)
    harness.advance(LEASE + 1)
    decision = worker_reads(harness)
    assert decision.action is Action.RUN
    assert decision.expect is not None and decision.write is not None
    holder_writes(harness, claim, write)
    with harness.store.session() as s:
        assert s.update(SCOPE, "k", decision.expect, decision.write) is None
        record = s.get(SCOPE, "k").record
    assert record is not None
    assert record.token == claim.token


def test_a_takeover_keeps_a_checkpoint_saved_after_it_read(harness: Harness) -> None:
    """A takeover stored after the holder's last checkpoint resumes from that checkpoint."""
    claim = first_claim(harness)
    harness.advance(LEASE + 1)
    decision = worker_reads(harness)  # the lease has lapsed: take over, no checkpoint
    assert decision.expect is not None and decision.write is not None
    holder_writes(harness, claim, "checkpoint")  # the holder lives: a checkpoint renews
    harness.advance(LEASE + 1)  # …and then stalls again past its lease
    with harness.store.session() as s:
        taken = s.update(SCOPE, "k", decision.expect, decision.write)
        record = s.get(SCOPE, "k").record
    assert record is not None
    kept = json.loads(record.checkpoint) if record.checkpoint else {}
    assert kept == {"charged": 1}, f"the takeover stored {kept}"
    # the lease lapsed again, so the takeover is taken, and its claim resumes from the
    # checkpoint the store kept, not the one it read
    assert taken is not None and taken.token == decision.write.token
    assert taken.checkpoint is not None and json.loads(taken.checkpoint) == kept


def test_a_reap_keeps_a_checkpoint_saved_after_it_read(harness: Harness) -> None:
    """The reaper's fenced write keeps the checkpoint the row holds when it lands, like a
    takeover: a holder that checkpointed after the reaper read and then lapsed again
    loses its claim, not its saved step."""
    from onceonly._core.admin import reap_decision

    claim = first_claim(harness)
    harness.advance(LEASE + 1)
    with harness.store.session() as s:
        snap = s.get(SCOPE, "k")
    assert snap.record is not None
    decided = reap_decision(snap.record, snap.now, new_token())
    assert decided is not None
    holder_writes(harness, claim, "checkpoint")  # renews the lease too
    harness.advance(LEASE + 1)  # …and lapses again before the reap lands
    expect, write = decided
    with harness.store.session() as s:
        reaped = s.update(SCOPE, "k", expect, write)
        record = s.get(SCOPE, "k").record
    assert reaped is not None and record is not None and record.state is State.FAILED
    kept = json.loads(record.checkpoint) if record.checkpoint else {}
    assert kept == {"charged": 1}, f"the reap stored {kept}"
