# SPDX-License-Identifier: MIT
"""Fuzz the inbox and leased mode end to end, on every store (docs/spec.md §2.2.2, §2.5).

Keys, payloads, results and error texts come from Hypothesis. Whatever they are: only
``OnceOnlyError`` subclasses (or the handler's own exception) escape, every call ends
within a bound, and a record committed before the bad input is untouched after it.
``HYPOTHESIS_PROFILE=fuzz`` (``make fuzz``) runs many more examples.
"""

from __future__ import annotations

import os
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import onceonly
from onceonly._core.state import Policy
from onceonly.inbox import LeasedRunner

LONG = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"
FUZZ = settings(
    max_examples=2_000 if LONG else 40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
BOUND = 5.0  # seconds a single call may take, whatever its input

nasty_text = st.text(
    alphabet=st.characters(codec=None, exclude_categories=()), max_size=40
) | st.sampled_from(["\x00", "\ud800", "a\udfffb", "\x00\ud800" * 50, "é" * 300, "?", "$$"])
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | nasty_text
    | st.sampled_from([float("nan"), float("inf")])
    | st.just(0).map(lambda _: 10**5000)  # past the digit limit (unrepresentable by repr)
)
payloads = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(nasty_text | st.integers() | st.none(), children, max_size=4)
    ),
    max_leaves=12,
)
keys = nasty_text | st.text(min_size=250, max_size=300) | st.sampled_from(["", " ", "k\n"])


def _deep(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


payloads = payloads | st.sampled_from([150, 5_000]).map(_deep)


class Boom(Exception):
    pass


def _bounded(call: Any) -> BaseException | None:
    start = time.monotonic()
    try:
        call()
    except (onceonly.OnceOnlyError, Boom) as exc:
        error: BaseException | None = exc
    else:
        error = None
    assert time.monotonic() - start < BOUND
    return error


def _witness(store: Any) -> Any:
    """A record committed before the fuzzing, to check nothing committed is lost."""
    inbox = onceonly.Inbox(store, consumer="fuzz")
    inbox.process("witness", {"n": 1}, lambda m, tx: {"kept": True})
    return inbox


@FUZZ
@given(key=keys, payload=payloads, result=payloads, error=nasty_text)
def test_fuzz_inbox(store: Any, key: Any, payload: Any, result: Any, error: str) -> None:
    """Any key, payload, result or error text: typed errors only, the witness survives."""
    inbox = _witness(store)

    def returns(msg: Any, tx: Any) -> Any:
        return result

    def raises(msg: Any, tx: Any) -> Any:
        raise Boom(error)

    _bounded(lambda: inbox.process(key, payload, returns))
    _bounded(lambda: inbox.process(key, payload, raises))
    _bounded(lambda: inbox.process(key, payload, returns))
    again = inbox.process("witness", {"n": 1}, lambda m, tx: {"kept": False})
    assert again.replayed and again.result == {"kept": True}


@FUZZ
@given(key=keys, result=payloads, error=nasty_text)
def test_fuzz_leased(leased_store: Any, key: Any, result: Any, error: str) -> None:
    """Leased mode: the same, with the function's result and error texts fuzzed."""
    witness = LeasedRunner(leased_store, scope="fuzz-w", policy=Policy(30.0, 3), ttl=None, wait=0.1)
    witness.run("witness", None, lambda: {"kept": True})
    runner = LeasedRunner(leased_store, scope="fuzz-fn", policy=Policy(30.0, 3), ttl=None, wait=0.1)

    def fails() -> Any:
        raise Boom(error)

    _bounded(lambda: runner.run(key, None, lambda: result))
    _bounded(lambda: runner.run(key + "x" if isinstance(key, str) else key, None, fails))
    assert witness.run("witness", None, lambda: None) == ({"kept": True}, True, 1)
