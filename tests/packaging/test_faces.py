# SPDX-License-Identifier: MIT
"""Each package's face: an ``__all__`` that is sorted, resolves and is complete.

A public module is one whose dotted path has no ``_`` component (``onceonly.inbox``,
``onceonly.brokers.kafka``, ``onceonly.contrib.django.views``); everything else is
private and may change in any release. Every public module declares ``__all__``, and a
package's ``__init__`` exports every public name it takes from its own modules.
"""

from __future__ import annotations

import ast
import importlib
import types

import pytest

from tests.conftest import unavailable
from tests.packaging.test_layout import SRC, module_files, private_owner

PUBLIC = sorted(
    name
    for name in module_files(SRC)
    if private_owner(name) is None and "__main__" not in name and ".migrations." not in name
)
PACKAGES = sorted(name for name, path in module_files(SRC).items() if path.name == "__init__.py")


def _declared_all(name: str) -> list[str] | None:
    """The literal ``__all__`` of a module's source, or None when it has none."""
    tree = ast.parse(module_files(SRC)[name].read_text(encoding="utf-8"))
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "__all__":
            value = ast.literal_eval(node.value)  # type: ignore[attr-defined]
            assert isinstance(value, list), f"{name}: __all__ is a list literal"
            return value
    return None


def _import(name: str) -> types.ModuleType:
    """Import a face; a missing extra skips here and fails in CI."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if "pip install" not in str(exc):
            raise
        unavailable(f"the extra of {name} ({exc})")
        raise  # unreachable: unavailable() skips or fails


def test_public_modules_are_found() -> None:
    """The scan sees the faces (an empty list would pass every test below)."""
    assert {"onceonly", "onceonly.inbox", "onceonly.brokers.kafka", "onceonly.http.asgi"} <= set(
        PUBLIC
    )
    assert "onceonly.http._flow" not in PUBLIC
    assert "onceonly._core.state" not in PUBLIC


@pytest.mark.parametrize("name", sorted(set(PUBLIC) | set(PACKAGES)))
def test_declares_a_sorted_all(name: str) -> None:
    """Every public module and every package ``__init__`` has a sorted ``__all__``."""
    declared = _declared_all(name)
    assert declared is not None, f"{name} has no __all__"
    assert declared == sorted(set(declared)), f"{name}: sort __all__, without duplicates"


@pytest.mark.parametrize("name", PUBLIC)
def test_face_imports_and_its_names_resolve(name: str) -> None:
    """The face imports (with warnings as errors) and each exported name resolves."""
    module = _import(name)
    for exported in module.__all__:
        if not hasattr(module, exported):
            importlib.import_module(f"{name}.{exported}")  # a submodule listed by name


@pytest.mark.parametrize("name", [p for p in PACKAGES if p in PUBLIC])
def test_package_face_exports_what_it_takes_from_its_modules(name: str) -> None:
    """A public name the ``__init__`` takes from its own package is in ``__all__``."""
    module = _import(name)
    missing = sorted(
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_")
        and not isinstance(value, types.ModuleType)
        and str(getattr(value, "__module__", "")).startswith(name + ".")
        and attr not in module.__all__
    )
    assert missing == [], f"{name}: add to __all__ or import privately"
