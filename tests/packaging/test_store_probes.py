# SPDX-License-Identifier: MIT
"""Nothing outside ``stores/`` probes a store or switches on a class name (STYLE.md §1):
what a caller needs of a store is a member of the store contract (:mod:`onceonly.types`).

Read from the source: a ``getattr``/``hasattr`` whose object is named ``store``
(``store``, ``self.store``, ``inbox.store``…), and a comparison with
``type(store).__name__``. :data:`KNOWN` lists the ones of today, which may only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "onceonly"

# The inbox is being restructured; its probes go with that work. Never add one.
KNOWN = (
    "inbox/_atomic.py: getattr(store, 'dialect', None)",
    "inbox/_atomic_async.py: getattr(store, 'dialect', None)",
    "inbox/_decorator.py: getattr(store, 'migrate', None)",
    "inbox/_leased_inbox.py: getattr(store, 'atomic', False)",
    "inbox/_leased_inbox_async.py: getattr(store, 'atomic', False)",
)


def _name(node: ast.AST) -> str:
    """The last name of a dotted expression (``self.inbox.store`` -> ``store``)."""
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _store_type_name(node: ast.AST) -> bool:
    """``type(store).__name__`` (of anything named ``store``)."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "__name__"
        and isinstance(node.value, ast.Call)
        and _name(node.value.func) == "type"
        and bool(node.value.args)
        and "store" in _name(node.value.args[0]).lower()
    )


def probes() -> list[str]:
    """``file: code`` of each probe or class-name switch outside ``stores/``."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        where = path.relative_to(SRC).as_posix()
        if where.startswith("stores/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            call = isinstance(node, ast.Call) and _name(node.func) in ("getattr", "hasattr")
            if call and node.args and "store" in _name(node.args[0]).lower():  # type: ignore[attr-defined]
                found.append(f"{where}: {ast.unparse(node)}")
            if isinstance(node, ast.Compare) and any(
                _store_type_name(sub)
                for part in (node.left, *node.comparators)
                for sub in ast.walk(part)
            ):
                found.append(f"{where}: {ast.unparse(node)}")
    return sorted(found)


def test_no_store_probes_outside_the_stores() -> None:
    """No new probe; a listed one that is gone is deleted from :data:`KNOWN`."""
    assert probes() == sorted(KNOWN)
