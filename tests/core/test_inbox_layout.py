# SPDX-License-Identifier: MIT
"""The inbox package's shape (STYLE §1): one claim loop, no import cycles, and no object
reaching into another's private members (read from the source, no import needed)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "onceonly"
INBOX = SRC / "inbox"
# What acting on a claim decision needs: only the claim loop imports it.
DECISION_NAMES = {"Action", "decide", "precounted_run", "own_claim"}
CLAIM_LOOP = {"inbox/_claim_async.py", "inbox/_claim.py"}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _inbox_imports() -> dict[str, set[str]]:
    """Each inbox module and the inbox modules it imports (``TYPE_CHECKING`` ones too)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(INBOX.glob("*.py")):
        name = _module(path)
        graph[name] = {
            node.module
            for node in ast.walk(_tree(path))
            if isinstance(node, ast.ImportFrom)
            and node.module is not None
            and node.module.startswith("onceonly.inbox.")
        } - {name}
    return graph


def test_no_import_cycle_inside_the_inbox_package() -> None:
    """No inbox module imports, even for typing, one that imports it back."""
    graph = _inbox_imports()
    cycles = []
    for start in graph:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    cycles.append(" -> ".join([*path, nxt]))
                elif nxt not in path:
                    stack.append((nxt, [*path, nxt]))
    assert cycles == []


def test_only_the_face_imports_the_inbox_classes() -> None:
    """``_atomic`` and ``_atomic_async`` (the inbox classes) are imported by the package's
    face only: no helper module takes the inbox."""
    importers = sorted(
        name
        for name, imported in _inbox_imports().items()
        if name != "onceonly.inbox"
        and any(m.startswith("onceonly.inbox._atomic") for m in imported)
    )
    assert importers == []


def test_claim_decisions_are_acted_on_in_one_place() -> None:
    """Only the claim loop imports what acting on a claim decision needs."""
    users = set()
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("_core/"):
            continue
        for node in ast.walk(_tree(path)):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module in ("onceonly._core.state", "onceonly._core.attempts")
                and DECISION_NAMES & {a.name for a in node.names}
            ):
                users.add(rel)
    assert users == CLAIM_LOOP


@pytest.mark.parametrize("package", ["inbox", "http", "contrib"])
def test_no_private_member_of_another_object(package: str) -> None:
    """Outside ``self``/``cls``/``super()``, no ``x._name`` is read or called."""
    found = []
    for path in sorted((SRC / package).rglob("*.py")):
        for node in ast.walk(_tree(path)):
            if not isinstance(node, ast.Attribute):
                continue
            if not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and ast.unparse(owner.func) == "super":
                continue
            found.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


INBOX_CLASSES = {"Inbox", "AsyncInbox", "LeasedRunner", "AsyncLeasedRunner", "Claim", "AsyncClaim"}


@pytest.mark.parametrize("package", ["http", "contrib", "brokers"])
def test_adapters_override_no_private_method_of_the_inbox(package: str) -> None:
    """An adapter changes what the inbox does through its public options, never by
    overriding one of its private methods in a subclass."""
    found = []
    for path in sorted((SRC / package).rglob("*.py")):
        for node in ast.walk(_tree(path)):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
            if not bases & INBOX_CLASSES:
                continue
            found += [
                f"{path.relative_to(SRC)}:{item.lineno}: {node.name}.{item.name}"
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                and item.name.startswith("_")
                and not item.name.startswith("__")
            ]
    assert found == []
