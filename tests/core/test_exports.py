# SPDX-License-Identifier: MIT
"""The public namespace: ``onceonly.__all__`` and the error tree (DESIGN §4)."""

from __future__ import annotations

import types

import pytest

import onceonly
from onceonly import errors

DESIGN_ERRORS = [
    "InvalidKey",
    "PayloadMismatch",
    "InFlight",
    "DeadLettered",
    "LeaseLost",
    "StoreError",
    "TooLarge",
]


def test_all_is_sorted() -> None:
    """__all__ is sorted and has no duplicates."""
    assert onceonly.__all__ == sorted(set(onceonly.__all__))


def test_all_is_complete() -> None:
    """Every public, non-module name in the package namespace is exported, and only those."""
    public = {
        name
        for name, value in vars(onceonly).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(onceonly.__all__) == public


def test_all_names_exist() -> None:
    """Every name in __all__ resolves."""
    for name in onceonly.__all__:
        assert getattr(onceonly, name) is not None


def test_version() -> None:
    """The package has a version string."""
    assert isinstance(onceonly.__version__, str)
    assert onceonly.__version__


def test_design_surfaces_are_exported() -> None:
    """The surfaces DESIGN §4 calls stable are exported."""
    for name in [
        "open_store",
        "open_async_store",
        "Inbox",
        "AsyncInbox",
        "idempotent",
        "Outcome",
        "OnceOnlyError",
        *DESIGN_ERRORS,
    ]:
        assert name in onceonly.__all__


@pytest.mark.parametrize("name", DESIGN_ERRORS)
def test_design_errors_subclass_the_root(name: str) -> None:
    """Every error named in DESIGN §4 exists and derives from OnceOnlyError."""
    cls = getattr(onceonly, name)
    assert issubclass(cls, onceonly.OnceOnlyError)
    assert issubclass(cls, Exception)


@pytest.mark.parametrize("name", ["InvalidKey", "PayloadMismatch", "TooLarge"])
def test_bad_input_errors_are_value_errors(name: str) -> None:
    """Errors about the caller's values are also ValueErrors."""
    assert issubclass(getattr(onceonly, name), ValueError)


def test_error_tree() -> None:
    """Transient and corrupt-row errors are StoreErrors; EncodingError is a TypeError."""
    assert issubclass(onceonly.StoreUnavailable, onceonly.StoreError)
    assert issubclass(onceonly.CorruptRecord, onceonly.StoreError)
    assert issubclass(onceonly.EncodingError, TypeError)
    assert issubclass(onceonly.ConfigurationError, ValueError)
    for name in ("InFlight", "DeadLettered", "LeaseLost", "StoreError"):
        assert not issubclass(getattr(onceonly, name), ValueError)


def test_every_error_is_exported_from_the_package() -> None:
    """Each class in onceonly.errors is re-exported by the package under its name."""
    assert errors.__all__ == sorted(errors.__all__)
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, onceonly.OnceOnlyError)
        assert getattr(onceonly, name) is cls


def test_errors_carry_key_and_scope() -> None:
    """Errors remember the key and scope they are about, and the extra details."""
    exc = onceonly.InFlight("busy", key="k", scope="s", retry_after=2.5)
    assert (exc.key, exc.scope, exc.retry_after, str(exc)) == ("k", "s", 2.5, "busy")
    dead = onceonly.DeadLettered("dead", key="k", attempts=5, error="ValueError: x")
    assert (dead.attempts, dead.error) == (5, "ValueError: x")
    assert onceonly.PayloadMismatch("x").status_hint == 422
    assert onceonly.InFlight("x").status_hint == 409
