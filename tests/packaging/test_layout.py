# SPDX-License-Identifier: MIT
"""The import rules of the package layout (STYLE.md §1), read from the source.

Every import of every module under src/onceonly counts: module level, inside functions,
under ``if TYPE_CHECKING:``. A module belongs to a *unit*: a root module
(``onceonly.errors``), a package (``onceonly.inbox``), a store backend
(``onceonly.stores.postgres``) or an integration (``onceonly.contrib.celery``); the face
of a unit is its ``__init__`` (or the root module itself). The rules:

* :data:`RULES`: which units a unit may import, and whether only their face;
* a module never imports a private module or name (a ``_`` component) of a package it is
  not inside: ``onceonly._core`` and ``onceonly._runtime`` are private to ``onceonly``,
  ``onceonly.stores._threaded`` to ``onceonly.stores`` (so its backends share it);
* ``onceonly._core`` imports nothing outside the standard library, and nothing of it
  that does I/O, reads a clock or runs an event loop;
* no import cycle spans two units.

The layout is still being brought to these rules: :data:`KNOWN` lists, one
``importer -> imported`` line each, the violations that exist today. A new violation
fails; so does a listed one that is gone (delete its line: the list only shrinks).
"""

from __future__ import annotations

import ast
import fnmatch
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "onceonly"

# What each unit may import besides its own modules. ``"U"``: any module of unit U;
# ``"U:face"``: only U itself (its __init__); ``"U:helpers"``: any module of U but its
# face. A ``*`` matches one name (``onceonly.stores.*`` is each store backend, as a row
# and as a target); ``"*"`` alone allows every unit (the command line).
_ANY = ("*",)
_LEAF = ("onceonly.errors", "onceonly.messaging")  # what _core may use
_FLOW = (
    "onceonly._core",
    "onceonly._runtime",
    "onceonly.errors",
    "onceonly.events",
    "onceonly.keys",
    "onceonly.messaging",
    "onceonly.types",
)
_BACKEND = (
    "onceonly._core",
    "onceonly._runtime",
    "onceonly.errors",
    "onceonly.types",
    "onceonly.stores:helpers",
)
_PUBLIC = (  # what an adapter may use: _core and the public faces of the layers below
    "onceonly:face",
    "onceonly._core",
    "onceonly.admin:face",
    "onceonly.errors",
    "onceonly.events",
    "onceonly.inbox:face",
    "onceonly.keys",
    "onceonly.messaging",
    "onceonly.outbox:face",
    "onceonly.prometheus",
    "onceonly.stores.*:face",
    "onceonly.stores:face",
    "onceonly.tracing",
    "onceonly.types",
)
# The command line (and its demo) wire everything together: they may use any module.
WIRING = frozenset({"onceonly.cli", "onceonly.demo", "onceonly.__main__"})

RULES: dict[str, tuple[str, ...]] = {
    # the pure core and the root modules below everything
    "onceonly._core": _LEAF,
    "onceonly.errors": (),
    "onceonly.messaging": ("onceonly.errors",),
    "onceonly.events": ("onceonly.errors", "onceonly.messaging"),
    "onceonly.keys": ("onceonly._core", "onceonly.errors"),
    "onceonly._runtime": ("onceonly._core", "onceonly.errors"),
    "onceonly.types": (
        "onceonly._core",
        "onceonly.errors",
        "onceonly.events",
        "onceonly.messaging",
    ),
    "onceonly.tracing": ("onceonly.errors", "onceonly.events"),
    "onceonly.prometheus": ("onceonly.errors", "onceonly.events"),
    # stores: a backend uses the shared helpers of stores/, never another backend
    "onceonly.stores.*": _BACKEND,
    "onceonly.stores.tiered": (*_BACKEND, "onceonly.stores.redis:face"),
    "onceonly.stores": (
        "onceonly._core",
        "onceonly._runtime",
        "onceonly.errors",
        "onceonly.types",
        "onceonly.stores.*:face",
    ),
    # the flows: through the store contract (types), never a store
    "onceonly.inbox": (*_FLOW, "onceonly.outbox:face"),
    "onceonly.outbox": _FLOW,
    "onceonly.admin": _FLOW,
    # adapters: public faces (and _core) only, never each other
    "onceonly.brokers": _PUBLIC,
    "onceonly.http": _PUBLIC,
    "onceonly.contrib": _PUBLIC,
    "onceonly.contrib.*": _PUBLIC,
    "onceonly.dashboard": _PUBLIC,
    "onceonly.demo": _ANY,
    "onceonly.testing": (*_PUBLIC, "onceonly.brokers:face"),  # re-exports the memory broker
    # the root face re-exports the faces of the layers
    "onceonly": (
        "onceonly.admin:face",
        "onceonly.errors",
        "onceonly.inbox:face",
        "onceonly.keys",
        "onceonly.messaging",
        "onceonly.outbox:face",
        "onceonly.stores:face",
    ),
    # the command line wires everything together
    "onceonly.cli": _ANY,
    "onceonly.__main__": _ANY,
}

# Standard-library modules that _core must not import: I/O, clocks, threads, event loops.
CORE_FORBIDDEN = frozenset(
    {
        "asyncio",
        "io",
        "multiprocessing",
        "os",
        "pathlib",
        "select",
        "selectors",
        "shutil",
        "socket",
        "sqlite3",
        "subprocess",
        "threading",
        "time",
    }
)

# The violations of today, one "importer -> imported" per line, sorted. Fix one, delete
# its line; never add one.
KNOWN: tuple[str, ...] = (
    "onceonly.contrib.django.middleware -> onceonly.http._atomic",
    "onceonly.contrib.django.middleware -> onceonly.http._common",
    "onceonly.contrib.django.middleware -> onceonly.http._flow",
    "onceonly.contrib.django.views -> onceonly.http._common",
)


@dataclass(frozen=True)
class Import:
    """One imported module (or a name of it) of one module, at one line."""

    importer: str
    target: str  # a module; for ``from m import name`` where m.name is a module: m.name
    name: str | None  # the name taken from ``target`` when it is not a module
    line: int

    @property
    def path(self) -> str:
        """The dotted path imported: the module, or the module and the name."""
        return f"{self.target}.{self.name}" if self.name and self.name != "*" else self.target


def module_files(src: Path) -> dict[str, Path]:
    """Every module under ``src`` (the ``onceonly`` package directory) by dotted name."""
    found: dict[str, Path] = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, modules: Iterable[str]) -> Iterator[Import]:
    """Every import in one module, at any depth of its syntax tree."""
    known = set(modules)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, alias.name, None, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in known:
                    yield Import(name, submodule, None, node.lineno)
                else:
                    yield Import(name, source, alias.name, node.lineno)


def all_imports(src: Path) -> list[Import]:
    modules = module_files(src)
    return [imp for name, path in modules.items() for imp in imports_of(name, path, modules)]


def unit_of(module: str, src: Path) -> str:
    """The unit a module belongs to (see the module docstring)."""
    parts = module.split(".")
    if len(parts) == 1:
        return parts[0]
    if parts[1] in ("stores", "contrib") and len(parts) > 2 and not parts[2].startswith("_"):
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def rule_of(unit: str) -> tuple[str, ...] | None:
    """The allowed targets of a unit: its own row, else the row its pattern matches."""
    if unit in RULES:
        return RULES[unit]
    for pattern, allowed in RULES.items():
        if (
            "*" in pattern
            and fnmatch.fnmatchcase(unit, pattern)
            and "." not in unit[len(pattern) - 1 :]
        ):
            return allowed
    return None


def _matches(target: str, target_unit: str, spec: str) -> bool:
    if spec == "*":
        return True
    pattern, _, part = spec.partition(":")
    if (
        not fnmatch.fnmatchcase(target_unit, pattern)
        or "." in target_unit[len(pattern.rstrip("*")) :]
    ):
        return False
    if part == "face":
        return target == target_unit
    if part == "helpers":
        return target != target_unit
    return True


def private_owner(path: str) -> str | None:
    """The package a dotted path is private to: the parent of its first ``_`` component
    (``onceonly.stores._threaded`` -> ``onceonly.stores``), or None when it is public."""
    parts = path.split(".")
    for i, part in enumerate(parts[1:], start=1):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            return ".".join(parts[:i])
    return None


@dataclass(frozen=True)
class Violation:
    edge: str  # "importer -> imported"
    why: str
    where: str


def violations(src: Path = SRC) -> list[Violation]:
    """Every import that breaks a rule, in the order found."""
    found: list[Violation] = []
    modules = module_files(src)
    imports = all_imports(src)

    def where(imp: Import) -> str:
        return f"{modules[imp.importer].relative_to(src.parent.parent)}:{imp.line}"

    for imp in imports:
        unit = unit_of(imp.importer, src)
        top = imp.target.split(".")[0]
        if top != "onceonly":
            if unit == "onceonly._core" and (top == "__future__" or top in sys.stdlib_module_names):
                if top in CORE_FORBIDDEN:
                    found.append(
                        Violation(
                            f"{imp.importer} -> {imp.target}", "_core does no I/O", where(imp)
                        )
                    )
            elif unit == "onceonly._core":
                found.append(
                    Violation(
                        f"{imp.importer} -> {imp.target}",
                        "_core imports the standard library only",
                        where(imp),
                    )
                )
            continue
        edge = f"{imp.importer} -> {imp.target}"
        owner = private_owner(imp.path)
        wiring = unit in WIRING  # the command line wires everything (the table)
        if (
            owner is not None
            and not wiring
            and not (imp.importer == owner or imp.importer.startswith(owner + "."))
        ):
            private = imp.target if private_owner(imp.target) else imp.path
            found.append(
                Violation(f"{imp.importer} -> {private}", f"private to {owner}", where(imp))
            )
        target_unit = unit_of(imp.target, src)
        if target_unit == unit:
            continue
        allowed = rule_of(unit)
        if allowed is None:
            found.append(Violation(edge, f"no rule for {unit} in RULES", where(imp)))
        elif not any(_matches(imp.target, target_unit, spec) for spec in allowed):
            found.append(Violation(edge, f"{unit} may not import {imp.target}", where(imp)))
    found.extend(_cycles(imports, src, where))
    return found


def _cycles(imports: list[Import], src: Path, where: Callable[[Import], str]) -> list[Violation]:
    """The cross-unit edges of every import cycle that spans two units or more."""
    graph: dict[str, set[str]] = {}
    first: dict[tuple[str, str], Import] = {}
    for imp in imports:
        if imp.target.startswith("onceonly") and imp.target != imp.importer:
            graph.setdefault(imp.importer, set()).add(imp.target)
            first.setdefault((imp.importer, imp.target), imp)
    found: list[Violation] = []
    for component in _strongly_connected(graph):
        units = {unit_of(m, src) for m in component}
        if len(units) < 2:
            continue
        names = " / ".join(sorted(units))
        for a in sorted(component):
            for b in sorted(graph.get(a, ())):
                if b in component and unit_of(a, src) != unit_of(b, src):
                    imp = first[(a, b)]
                    found.append(Violation(f"{a} -> {b}", f"import cycle of {names}", where(imp)))
    return found


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[set[str]] = []
    counter = 0
    nodes = sorted(set(graph) | {b for targets in graph.values() for b in targets})
    for start in nodes:
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                result.append(component)
    return result


def _report(items: Iterable[Violation]) -> str:
    """One line per edge: the edge, why, and where it is first imported."""
    grouped: dict[str, tuple[list[str], str]] = {}
    for v in items:
        whys, _ = grouped.setdefault(v.edge, ([], v.where))
        if v.why not in whys:
            whys.append(v.why)
    return "\n".join(
        f"    {edge!r},  # {'; '.join(whys)} ({where})"
        for edge, (whys, where) in sorted(grouped.items())
    )


def test_every_unit_has_a_rule() -> None:
    """A new package or root module needs its row in RULES before it can import anything."""
    units = {unit_of(m, SRC) for m in module_files(SRC)}
    assert sorted(u for u in units if rule_of(u) is None) == []


def test_known_is_sorted_and_unique() -> None:
    """One line per violation, in order, so two branches that each fix one merge cleanly."""
    assert list(KNOWN) == sorted(set(KNOWN))
    assert all(" -> " in entry for entry in KNOWN)


def test_imports_follow_the_layout() -> None:
    """No violation beyond KNOWN, and every KNOWN entry still occurs (delete fixed ones)."""
    found = violations()
    new = [v for v in found if v.edge not in KNOWN]
    gone = sorted(set(KNOWN) - {v.edge for v in found})
    message = []
    if new:
        message.append("imports that break the layout rules:\n" + _report(new))
    if gone:
        message.append(
            "fixed, delete from KNOWN in tests/packaging/test_layout.py:\n"
            + "\n".join(f"  {edge}" for edge in gone)
        )
    assert not message, "\n".join(message)


# The checker itself, on a small tree with one import of each kind that is forbidden.
_TREE = {
    "__init__.py": "from onceonly.inbox import Inbox\n",
    "errors.py": "",
    "messaging.py": "from onceonly.errors import X\n",
    "types.py": "",
    "_core/__init__.py": "",
    "_core/state.py": (
        "import json\nimport time\nimport psycopg\nfrom onceonly.errors import X\n"
        "from onceonly import messaging\n"
    ),
    "inbox/__init__.py": "from onceonly.inbox._atomic import Inbox\n",
    "inbox/_atomic.py": (
        "from typing import TYPE_CHECKING\n"
        "from onceonly._core import state\n"
        "if TYPE_CHECKING:\n    from onceonly.stores.postgres._store import S\n"
        "def f():\n    from onceonly.outbox import Outbox\n"
    ),
    "outbox/__init__.py": "from onceonly.outbox._outbox import Outbox\n",
    "outbox/_outbox.py": "def f():\n    from onceonly.inbox import Inbox\n",
    "stores/__init__.py": "",
    "stores/_shared.py": "",
    "stores/postgres/__init__.py": "from ._store import S\n",
    "stores/postgres/_store.py": (
        "from onceonly.stores._shared import X\nfrom onceonly.stores.redis import R\n"
    ),
    "stores/redis/__init__.py": "from onceonly.stores.redis._store import R\n",
    "stores/redis/_store.py": "",
    "http/__init__.py": "from onceonly.brokers import B\nfrom onceonly.errors import _private\n",
    "brokers/__init__.py": "",
}


def test_the_checker_finds_each_kind_of_violation(tmp_path: Path) -> None:
    """Function-level, TYPE_CHECKING and relative imports count; each rule reports."""
    src = tmp_path / "onceonly"
    for name, text in _TREE.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text, encoding="utf-8")
    got = {(v.edge, v.why) for v in violations(src)}
    assert got == {
        ("onceonly._core.state -> time", "_core does no I/O"),
        ("onceonly._core.state -> psycopg", "_core imports the standard library only"),
        (
            "onceonly.inbox._atomic -> onceonly.stores.postgres._store",
            "private to onceonly.stores.postgres",
        ),
        (
            "onceonly.inbox._atomic -> onceonly.stores.postgres._store",
            "onceonly.inbox may not import onceonly.stores.postgres._store",
        ),
        (
            "onceonly.stores.postgres._store -> onceonly.stores.redis",
            "onceonly.stores.postgres may not import onceonly.stores.redis",
        ),
        ("onceonly.http -> onceonly.brokers", "onceonly.http may not import onceonly.brokers"),
        ("onceonly.http -> onceonly.errors._private", "private to onceonly.errors"),
        (
            "onceonly.outbox._outbox -> onceonly.inbox",
            "onceonly.outbox may not import onceonly.inbox",
        ),
        (
            "onceonly.inbox._atomic -> onceonly.outbox",
            "import cycle of onceonly.inbox / onceonly.outbox",
        ),
        (
            "onceonly.outbox._outbox -> onceonly.inbox",
            "import cycle of onceonly.inbox / onceonly.outbox",
        ),
    }


@pytest.mark.parametrize(
    ("path", "owner"),
    [
        ("onceonly.inbox", None),
        ("onceonly._core.state", "onceonly"),
        ("onceonly.stores._threaded", "onceonly.stores"),
        ("onceonly.stores.postgres._store.PostgresStore", "onceonly.stores.postgres"),
        ("onceonly.errors._detail", "onceonly.errors"),
        ("onceonly.__main__", None),
    ],
)
def test_private_owner(path: str, owner: str | None) -> None:
    """A path is private to the package above its first ``_`` component."""
    assert private_owner(path) == owner
