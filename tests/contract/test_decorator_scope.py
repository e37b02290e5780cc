# SPDX-License-Identifier: MIT
"""The default scope of ``@idempotent`` and when ``scope=`` is required (docs/spec.md §1.7)."""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly.stores.memory import MemoryStore


def charge(order: str) -> str:
    return f"charged {order}"


async def acharge(order: str) -> str:
    return f"charged {order}"


class Billing:
    @staticmethod
    def refund(order: str) -> str:
        return f"refunded {order}"


def tenant_charger(store: Any, tenant: str, *, scope: str | None = None) -> Callable[[str], str]:
    """A factory: one charging function per tenant, all with the same qualified name."""

    @onceonly.idempotent(store, key=lambda order: order, scope=scope)
    def charge(order: str) -> str:
        return f"{tenant} charged {order}"

    return charge


def test_module_level_function_keeps_module_qualname_scope() -> None:
    """A module-level function is scoped by module.qualname, as before."""
    store = MemoryStore()
    onceonly.idempotent(store, key=lambda order: order)(charge)("o-1")
    fn = onceonly.idempotent(store, key=lambda order: order, scope=f"{__name__}.charge")(
        lambda order: "other"
    )
    assert fn("o-1") == "charged o-1"  # the same scope: the first result replays


def test_method_of_module_level_class_keeps_default_scope() -> None:
    """A qualname like Class.method is stable, so it needs no scope=."""
    store = MemoryStore()
    refund = onceonly.idempotent(store, key=lambda order: order)(Billing.refund)
    assert refund("o-1") == refund("o-1") == "refunded o-1"


async def test_async_module_level_function_keeps_default_scope() -> None:
    """The async form accepts a module-level coroutine function without scope=."""
    store = onceonly.open_async_store("memory://")
    fn = onceonly.idempotent(store, key=lambda order: order)(acharge)
    assert await fn("o-1") == await fn("o-1") == "charged o-1"


def test_function_made_by_a_factory_needs_a_scope() -> None:
    """Closures share a qualname: without scope= decorating one is a ConfigurationError."""
    with pytest.raises(onceonly.ConfigurationError, match=r"tenant_charger\.<locals>\.charge") as e:
        tenant_charger(MemoryStore(), "acme")
    assert "scope=" in str(e.value)


def test_factory_with_scopes_keeps_tenants_apart(leased_store: Any) -> None:
    """With a scope per tenant, one tenant is never replayed another's result."""
    acme = tenant_charger(leased_store, "acme", scope="charge:acme")
    globex = tenant_charger(leased_store, "globex", scope="charge:globex")
    assert acme("o-1") == "acme charged o-1"
    assert globex("o-1") == "globex charged o-1"
    assert acme("o-1") == "acme charged o-1"


def test_lambda_needs_a_scope() -> None:
    """A lambda has no name of its own: scope= is required."""
    with pytest.raises(onceonly.ConfigurationError, match=r"<lambda>.*scope="):
        onceonly.idempotent(MemoryStore(), key=lambda order: order)(lambda order: order)


async def test_async_closure_needs_a_scope() -> None:
    """The async form refuses a coroutine function defined inside a function too."""
    store = onceonly.open_async_store("memory://")
    with pytest.raises(onceonly.ConfigurationError, match=r"<locals>.*scope="):

        @onceonly.idempotent(store, key=lambda order: order)
        async def work(order: str) -> str:
            return order


def test_nested_function_with_scope_is_accepted() -> None:
    """scope= makes any function acceptable, and is used as given."""
    store = MemoryStore()

    @onceonly.idempotent(store, key=lambda order: order, scope="billing.charge")
    def work(order: str) -> str:
        return order

    assert work("o-1") == "o-1"
    with store.session() as s:
        assert s.get("billing.charge", "o-1").record is not None


def test_main_module_function_needs_a_scope() -> None:
    """A function of __main__ is refused without scope= (its name changes on import)."""

    def job(order: str) -> str:
        return order

    job.__qualname__ = "job"
    job.__module__ = "__main__"
    with pytest.raises(onceonly.ConfigurationError, match=r"__main__\.job.*scope="):
        onceonly.idempotent(MemoryStore(), key=lambda order: order)(job)
    assert onceonly.idempotent(MemoryStore(), key=lambda o: o, scope="jobs.job")(job)("o") == "o"


def test_script_run_as_main_gets_the_error(tmp_path: Path) -> None:
    """``python script.py`` decorating a top-level function without scope= fails at once."""
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """
            import onceonly
            store = onceonly.open_store("memory://")

            @onceonly.idempotent(store, key=lambda order: order)
            def charge(order):
                return order
            """
        )
    )
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 1
    assert "ConfigurationError: __main__.charge is defined in __main__" in run.stderr


def test_callable_without_a_name_needs_a_scope() -> None:
    """A functools.partial has no qualified name: scope= is required, and then works."""
    part = functools.partial(charge)
    with pytest.raises(onceonly.ConfigurationError, match="scope="):
        onceonly.idempotent(MemoryStore(), key=lambda order: order)(part)
    assert onceonly.idempotent(MemoryStore(), key=lambda o: o, scope="p")(part)("o") == "charged o"


def test_store_mismatch_is_reported_before_the_scope() -> None:
    """An async function with a sync store names the store problem first."""
    with pytest.raises(onceonly.ConfigurationError, match="give idempotent\\(\\) an async store"):

        @onceonly.idempotent(MemoryStore(), key=lambda: "k")
        async def f() -> None:
            return None


def test_empty_scope_is_refused() -> None:
    """scope='' is an invalid scope, not a request for the default."""
    with pytest.raises(onceonly.InvalidKey, match="scope must not be empty"):
        onceonly.idempotent(MemoryStore(), key=lambda order: order, scope="")(charge)
