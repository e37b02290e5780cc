# SPDX-License-Identifier: MIT
"""Print the layout measures of the onceonly package, to compare two checkouts.

Usage: python tools/layout_report.py [--src PATH/src/onceonly] [--json] [--no-runtime]
                                    [--trace]

Works on any checkout, including an old commit exported with
``git archive <commit> src | tar -x -C /tmp/x`` (``--src /tmp/x/src/onceonly``): the
static measures only parse the files; the runtime measure (section 8) imports onceonly
from ``--src`` and needs the local PostgreSQL and RabbitMQ.

Concepts: in the package layout a module's concept is its first package component
(``inbox/``, ``stores/``...); a module left at the root is its own concept (``errors``,
``types``...). Root modules of the old flat layout are mapped by name (ROOT_CONCEPTS).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import dis
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

DEFAULT_SRC = Path(__file__).resolve().parents[1] / "src" / "onceonly"
PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"

# Old flat layout: root module name -> concept (first matching rule wins).
ROOT_CONCEPTS: list[tuple[str, str]] = [
    (r"inbox.*|leased.*|tx.*|outcome|decorator|_inbox_rules|_running|_sqlalchemy", "inbox"),
    (r"outbox.*|relay.*|_outbox_.*", "outbox"),
    (r"admin.*|_admin_common", "admin"),
    (r"cli.*|_cli_store|doctor.*", "cli"),
    (r"open|_engine", "stores"),
]
# Store backends, by the first component under stores/ or the file name's prefix.
BACKENDS: list[tuple[str, str]] = [
    (r"postgres.*", "postgres"),
    (r"mysql.*", "mysql"),
    (r"sqlite.*", "sqlite"),
    (r"redis.*", "redis"),
    (r"tiered.*|tiers.*", "tiered"),
    (r"memory.*", "memory"),
]
VOCABULARY = {
    "errors", "types", "messaging", "events", "keys", "_acompat", "tracing", "prometheus",
    "testing",
}  # fmt: skip
LAYERS: dict[str, int] = {
    "_core": 0,
    **dict.fromkeys(VOCABULARY, 1),
    "stores": 2,
    "inbox": 3,
    "outbox": 3,
    "admin": 3,
    "brokers": 4,
    "http": 4,
    "contrib": 4,
    "dashboard": 4,
    "cli": 5,
    "demo": 5,
    "__init__": 5,
    "__main__": 5,
}
ALLOWED_SIDEWAYS = {("inbox", "outbox")}  # the only arrow allowed inside layer 3
# The claim decision: decide()'s Decision and its Action (RUN, REPLAY, IN_FLIGHT,
# MISMATCH, DEAD), and the objects a claim call answers with.
CLAIM_TYPES = {"Decision", "Replay", "Claim", "AsyncClaim"}
CLAIM_ACTIONS = {"RUN", "REPLAY", "IN_FLIGHT", "MISMATCH", "DEAD"}
VERDICT_ACTIONS = {"ACK", "RETRY", "DEAD_LETTER"}  # _core.settle: how a delivery ends
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
CO_RESUMABLE = 0x20 | 0x80 | 0x200  # generator, coroutine, async generator


# ----------------------------------------------------------------------------- modules


@dataclass
class Module:
    """One .py file of the package."""

    name: str  # dotted: onceonly.stores.postgres (a package: its name)
    rel: tuple[str, ...]  # ("stores", "postgres"); the root package: ()
    file: str  # path below src/onceonly
    tree: ast.Module
    package: bool


def load_modules(src: Path) -> dict[str, Module]:
    """Every module below ``src`` (a path to src/onceonly), by dotted name."""
    modules: dict[str, Module] = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        package = parts[-1] == "__init__"
        rel = parts[:-1] if package else parts
        name = ".".join(("onceonly", *rel))
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        modules[name] = Module(name, rel, path.relative_to(src).as_posix(), tree, package)
    return modules


def is_private(part: str) -> bool:
    """``_x`` is private; dunders (``__init__``, ``__main__``) are not."""
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def concept(mod: Module) -> str:
    """The concept package a module belongs to."""
    if not mod.rel:
        return "__init__"
    if len(mod.rel) > 1 or mod.package:
        return mod.rel[0]
    for pattern, name in ROOT_CONCEPTS:
        if re.fullmatch(pattern, mod.rel[0]):
            return name
    return mod.rel[0]


def backend(mod: Module) -> str | None:
    """The store backend of a module of ``stores`` (``shared`` for the common parts)."""
    if concept(mod) != "stores":
        return None
    if len(mod.rel) > 2 or (len(mod.rel) == 2 and mod.package):
        word = mod.rel[1]  # package layout: stores/<backend>/...
    else:
        word = mod.rel[-1].lstrip("_")
    for pattern, name in BACKENDS:
        if re.fullmatch(pattern, word):
            return name
    return "shared"  # threaded, engine_pool, open, _engine, stores/__init__


def inner_parts(mod: Module) -> tuple[str, ...]:
    """The path components inside the module's concept package (its face: none)."""
    if len(mod.rel) == 1 and not mod.package:
        return () if concept(mod) == mod.rel[0] else mod.rel
    return mod.rel[1:]


def looks_public(mod: Module) -> bool:
    return not any(is_private(p) for p in mod.rel)


# ----------------------------------------------------------------------------- imports


@dataclass(frozen=True)
class Import:
    src: str
    dst: str
    line: int
    kind: str  # "top" (runs at import), "function" (inside a def), "type_checking"
    private_names: tuple[str, ...] = ()  # from dst import _x (names, not modules)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def walk_with_context(tree: ast.AST) -> Iterator[tuple[ast.AST, bool, bool]]:
    """Every node with (inside a function, inside ``if TYPE_CHECKING:``)."""
    stack: list[tuple[ast.AST, bool, bool]] = [(tree, False, False)]
    while stack:
        node, in_def, in_tc = stack.pop()
        yield node, in_def, in_tc
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend((child, in_def, True) for child in node.body)
            stack.extend((child, in_def, in_tc) for child in node.orelse)
            continue
        deeper = in_def or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        stack.extend((child, deeper, in_tc) for child in ast.iter_child_nodes(node))


def _resolve_base(mod: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = mod.name.split(".") if mod.package else mod.name.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def find_imports(modules: dict[str, Module]) -> list[Import]:
    """Every import of a onceonly module by another, anywhere in the file: one per
    statement and module imported (``from m import a, b`` is one import of ``m``)."""
    found: dict[tuple[str, str, int, str], set[str]] = {}
    for mod in modules.values():
        for node, in_def, in_tc in walk_with_context(mod.tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            kind = "type_checking" if in_tc else "function" if in_def else "top"
            targets: list[tuple[str | None, str | None]] = []  # (module, private name)
            if isinstance(node, ast.Import):
                targets = [(_longest_module(a.name, modules), None) for a in node.names]
            else:
                base = _resolve_base(mod, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in modules:
                        targets.append((sub, None))
                    else:
                        private = alias.name if is_private(alias.name) else None
                        targets.append((_longest_module(base, modules), private))
            for target, private in targets:
                if target and target != mod.name:
                    names = found.setdefault((mod.name, target, node.lineno, kind), set())
                    if private:
                        names.add(private)
    return [Import(*key, tuple(sorted(names))) for key, names in found.items()]


def _longest_module(dotted: str, modules: dict[str, Module]) -> str | None:
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in modules:
            return name
    return None


# ----------------------------------------------------------------------------- graphs


def strongly_connected(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return sorted(components, key=lambda c: (-len(c), c))


def upward(src_concept: str, dst_concept: str) -> str | None:
    """``"up"`` when the arrow points to a higher layer, ``"sideways"`` for a forbidden
    arrow inside layer 3 or 4, ``"unknown"`` for a concept without a layer."""
    if src_concept == dst_concept:
        return None
    a, b = LAYERS.get(src_concept), LAYERS.get(dst_concept)
    if a is None or b is None:
        return "unknown"
    if b > a:
        return "up"
    if a == b and a in (3, 4) and (src_concept, dst_concept) not in ALLOWED_SIDEWAYS:
        return "sideways"
    return None


def node_of(mod: Module, scale: str) -> str:
    """The node a module counts as at a given scale."""
    if scale == "module":
        return mod.file
    if scale == "twin":  # x_async.py and its generated x.py are one module
        return re.sub(r"_async(?=\.py$|/__init__\.py$)", "", mod.file)
    if scale == "package":  # a root module, or a package directory (not its subpackages)
        if len(mod.rel) == 1 and not mod.package:
            return mod.file
        return "/".join(mod.rel if mod.package else mod.rel[:-1]) + "/"
    if scale == "concept":
        return concept(mod)
    raise ValueError(scale)


@dataclass
class Graph:
    nodes: list[str]
    arrows: set[tuple[str, str]]
    type_checking_only: set[tuple[str, str]]
    cycles: list[list[str]]
    witnesses: dict[tuple[str, str], list[str]] = field(default_factory=dict)


def build_graph(
    modules: dict[str, Module], imports: list[Import], scale: str, kinds: set[str]
) -> Graph:
    nodes = sorted({node_of(m, scale) for m in modules.values()})
    arrows: set[tuple[str, str]] = set()
    tc: set[tuple[str, str]] = set()
    witnesses: dict[tuple[str, str], list[str]] = defaultdict(list)
    for imp in imports:
        a, b = node_of(modules[imp.src], scale), node_of(modules[imp.dst], scale)
        if a == b:
            continue
        if imp.kind in kinds:
            arrows.add((a, b))
            place = f"{modules[imp.src].file}:{imp.line}"
            if place not in witnesses[(a, b)]:
                witnesses[(a, b)].append(place)
        elif imp.kind == "type_checking":
            tc.add((a, b))
    ordered = {k: sorted(v, key=_by_place) for k, v in witnesses.items()}
    return Graph(nodes, arrows, tc - arrows, strongly_connected(arrows), ordered)


def against_layers(
    graph: Graph, modules: dict[str, Module], scale: str
) -> list[tuple[str, str, str, str, str]]:
    """The arrows that point upward or sideways: (from, to, its concept, its concept, how)."""
    concepts = {node_of(m, scale): concept(m) for m in modules.values()}
    out = []
    for a, b in sorted(graph.arrows):
        how = upward(concepts[a], concepts[b])
        if how:
            out.append((a, b, concepts[a], concepts[b], how))
    return out


# ----------------------------------------------------------------------------- AST checks


def _qualnames(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """Every function with its qualified name (Class.method, outer.inner)."""

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")
            else:
                yield from visit(child, prefix)

    yield from visit(tree, "")


def _own_nodes(func: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function, not those of the functions and classes nested in it."""
    stack = list(ast.iter_child_nodes(func))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def imported_names(mod: Module, modules: dict[str, Module]) -> dict[str, str]:
    """Local name -> the dotted onceonly object it stands for (module or attribute)."""
    names: dict[str, str] = {}
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.ImportFrom):
            base = _resolve_base(mod, node)
            if base.startswith("onceonly"):
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("onceonly") and alias.asname:
                    names[alias.asname] = alias.name
    return names


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def _resolve(expr: ast.expr, names: dict[str, str]) -> str | None:
    """``Action.RUN`` -> ``onceonly._core.state.Action.RUN`` through the imports."""
    dotted = _dotted(expr)
    if not dotted:
        return None
    head, _, tail = dotted.partition(".")
    if head in names:
        return names[head] + (f".{tail}" if tail else "")
    return dotted


def fold_twin(place: str) -> str:
    """``inbox_async.py:AsyncInbox.process`` and ``inbox.py:Inbox.process`` are one place."""
    file, _, function = place.partition(":")
    file = re.sub(r"_async(?=\.py$)", "", file)
    return f"{file}:{re.sub(r'^Async', '', function)}"


def claim_kind(resolved: str) -> str | None:
    """What a resolved name says about a decision: ``"type"`` for a claim-decision class,
    ``"claim"`` for a member of _core.state's Action, ``"verdict"`` for _core.settle's."""
    if not resolved.startswith("onceonly."):
        return None
    if resolved.rsplit(".", 1)[-1] in CLAIM_TYPES:
        decision = resolved.rsplit(".", 1)[-1] == "Decision"
        return "type" if not decision or resolved.startswith("onceonly._core.") else None
    m = re.fullmatch(r"onceonly\._core\.(state|settle)\.Action\.(\w+)", resolved)
    if m and m.group(1) == "state" and m.group(2) in CLAIM_ACTIONS:
        return "claim"
    if m and m.group(1) == "settle" and m.group(2) in VERDICT_ACTIONS:
        return "verdict"
    return None


def decision_dispatch(modules: dict[str, Module]) -> tuple[list[str], list[str]]:
    """Functions that decide or branch on a claim decision; and on a settle verdict."""
    claim: list[str] = []
    verdict: list[str] = []
    for mod in modules.values():
        names = {
            node.name: f"{mod.name}.{node.name}"
            for node in mod.tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        } | imported_names(mod, modules)

        def kind_of(expr: ast.expr, names: dict[str, str] = names) -> str | None:
            return claim_kind(_resolve(expr, names) or "")

        for qualname, func in _qualnames(mod.tree):
            why: set[str] = set()
            kinds: set[str | None] = set()
            for node in _own_nodes(func):
                if isinstance(node, ast.Call):
                    target = _resolve(node.func, names) or ""
                    if re.fullmatch(r"onceonly\._core\.[\w.]*decide", target):
                        why.add("decide()")
                    elif target == "isinstance" and len(node.args) == 2:
                        spec = node.args[1]
                        options = spec.elts if isinstance(spec, ast.Tuple) else [spec]
                        if any(kind_of(o) == "type" for o in options):
                            why.add("isinstance")
                elif isinstance(node, ast.Compare):
                    kinds |= {kind_of(x) for x in [node.left, *node.comparators]}
                elif isinstance(node, ast.MatchValue):
                    kinds.add(kind_of(node.value))
                elif isinstance(node, ast.MatchClass) and kind_of(node.cls) == "type":
                    why.add("match")
            if "claim" in kinds:
                why.add("Action")
            if why:
                claim.append(f"{mod.file}:{qualname} ({', '.join(sorted(why))})")
            if "verdict" in kinds:
                verdict.append(f"{mod.file}:{qualname}")
    return sorted(claim), sorted(verdict)


def defined_names(mod: Module) -> set[str]:
    """Names a module defines: its functions and classes, what its module and class
    bodies assign, ``self.x = ...`` / ``cls.x = ...``, ``setattr`` and ``__slots__``."""
    names: set[str] = set()
    bodies: list[list[ast.stmt]] = [mod.tree.body]
    for node in ast.walk(mod.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                bodies.append(node.body)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)
        elif (
            isinstance(node, ast.Call)
            and _dotted(node.func) in ("setattr", "object.__setattr__")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
        ):
            names.add(str(node.args[1].value))
    for body in bodies:
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            names |= {
                sub.id
                for sub in _own_nodes(stmt)
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store)
            }
            if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in stmt.targets
            ):
                names |= {
                    c.value
                    for c in ast.walk(stmt.value)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                }
    return names


@dataclass
class PrivateAccess:
    cross: list[str]  # x._name, _name defined only in other concepts
    foreign: list[str]  # x._name, _name defined nowhere in onceonly (another library's)
    imports: list[str]  # private names or modules of another concept imported


def private_access(modules: dict[str, Module], imports: list[Import]) -> PrivateAccess:
    by_concept: dict[str, set[str]] = defaultdict(set)
    for mod in modules.values():
        by_concept[concept(mod)] |= defined_names(mod)
    everywhere = set().union(*by_concept.values())
    cross: list[str] = []
    foreign: list[str] = []
    for mod in modules.values():
        own = by_concept[concept(mod)]
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Attribute):
                value, attr = node.value, node.attr
            elif (
                isinstance(node, ast.Call)
                and _dotted(node.func) in ("getattr", "hasattr", "setattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
            ):
                value, attr = node.args[0], str(node.args[1].value)
            else:
                continue
            if not is_private(attr) or attr in NAMEDTUPLE_API or attr in own:
                continue
            if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                continue
            if isinstance(value, ast.Call) and _dotted(value.func) == "super":
                continue
            text = f"{mod.file}:{node.lineno} {ast.unparse(node)}"
            if attr in everywhere:
                owners = sorted(c for c, n in by_concept.items() if attr in n)
                cross.append(f"{text} (defined in {', '.join(owners)})")
            else:
                foreign.append(text)
    imported: list[str] = []
    for imp in imports:
        src, dst = modules[imp.src], modules[imp.dst]
        if concept(src) == concept(dst):
            continue
        if imp.private_names:
            names = ", ".join(imp.private_names)
            imported.append(f"{src.file}:{imp.line} from {dst.name} import {names}")
        elif any(is_private(p) for p in inner_parts(dst)):
            imported.append(f"{src.file}:{imp.line} {dst.name}")
    return PrivateAccess(
        sorted(set(cross), key=_by_place),
        sorted(set(foreign), key=_by_place),
        sorted(set(imported), key=_by_place),
    )


def _by_place(text: str) -> tuple[str, int, str]:
    """Sort ``file:line ...`` texts by file, then line number, then text."""
    place = text.split(" ", 1)[0]
    file, _, line = place.rpartition(":")
    return file, int(line) if line.isdigit() else 0, text


def probes(modules: dict[str, Module]) -> tuple[list[str], list[str], int]:
    """``type(x).__name__`` comparisons, ``getattr``/``hasattr`` on a store outside
    stores/, and the count of other ``type(x).__name__`` uses (messages)."""

    def type_name(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "__name__"
            and (
                (isinstance(node.value, ast.Call) and _dotted(node.value.func) == "type")
                or (isinstance(node.value, ast.Attribute) and node.value.attr == "__class__")
            )
        )

    switches: list[str] = []
    store_probes: list[str] = []
    other = 0
    for mod in modules.values():
        compared: set[int] = set()
        for node in ast.walk(mod.tree):
            if isinstance(node, (ast.Compare, ast.Match)):
                parts = (
                    [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
                ) + ([node.subject] if isinstance(node, ast.Match) else [])
                for part in parts:
                    for sub in ast.walk(part):
                        if type_name(sub):
                            compared.add(id(sub))
                            switches.append(f"{mod.file}:{node.lineno} {ast.unparse(node)}")
        for node in ast.walk(mod.tree):
            if type_name(node) and id(node) not in compared:
                other += 1
            if (
                concept(mod) != "stores"
                and isinstance(node, ast.Call)
                and _dotted(node.func) in ("getattr", "hasattr")
                and node.args
            ):
                last = (_dotted(node.args[0]) or "").rsplit(".", 1)[-1]
                if "store" in last.lower():
                    store_probes.append(f"{mod.file}:{node.lineno} {ast.unparse(node)}")
    return sorted(set(switches), key=_by_place), sorted(store_probes, key=_by_place), other


# ----------------------------------------------------------------------------- runtime


class Tracer:
    """Records the onceonly modules whose functions start running (sys.setprofile).

    A coroutine or generator resumed after an ``await``/``yield`` is not a new call:
    only a frame's first entry counts. ``stop_on = (package, name)`` ends the recording
    at the first call of a function ``name`` of that top-level package, and sets
    ``stopped``.
    """

    def __init__(self) -> None:
        self.calls: list[str] = []  # module:function of each call
        self.recording = False
        self.stop_on: tuple[str, str] | None = None
        self.stopped: asyncio.Event | None = None
        self._first_resume: dict[CodeType, int] = {}

    def _fresh(self, frame: FrameType) -> bool:
        code = frame.f_code
        if not code.co_flags & CO_RESUMABLE:
            return True
        first = self._first_resume.get(code)
        if first is None:
            first = next((i.offset for i in dis.get_instructions(code) if i.opname == "RESUME"), 0)
            self._first_resume[code] = first
        return frame.f_lasti <= first

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        code = frame.f_code
        if self.stop_on and (module.split(".")[0], code.co_name) == self.stop_on:
            self.recording = False
            self.stop_on = None
            if self.stopped:
                self.stopped.set()
            return
        if self.recording and module.split(".")[0] == "onceonly" and self._fresh(frame):
            self.calls.append(f"{module}:{getattr(code, 'co_qualname', code.co_name)}")

    def start(self) -> None:
        self.calls = []
        self.recording = True

    def stop(self) -> list[str]:
        self.recording = False
        return self.calls


def runtime_concept(module: str, modules: dict[str, Module]) -> str:
    mod = modules.get(module)
    return concept(mod) if mod else module


def summarise_trace(sequence: list[str], modules: dict[str, Module]) -> dict[str, Any]:
    calls = [c.split(":", 1)[0] for c in sequence]
    entries = [m for i, m in enumerate(calls) if i == 0 or m != calls[i - 1]]
    concepts = [runtime_concept(m, modules) for m in entries]
    first_seen = list(dict.fromkeys(calls))
    return {
        "calls": len(calls),
        "module_entries": len(entries),
        "distinct_modules": len(first_seen),
        "package_changes": sum(a != b for a, b in itertools.pairwise(concepts)),
        "concepts": list(dict.fromkeys(concepts)),
        "modules": [f"{m} [{runtime_concept(m, modules)}]" for m in first_seen],
        "sequence": sequence,
    }


async def trace_rabbitmq(tracer: Tracer, store_url: str) -> list[str]:
    """One message from arrival to ack: RabbitMQConsumer, atomic AsyncInbox, PostgreSQL."""
    import aio_pika

    import onceonly
    from onceonly.brokers.rabbitmq import RabbitMQConsumer

    store = onceonly.open_async_store(store_url)
    await store.migrate()
    async with store.transaction() as session:
        await session.execute("CREATE TABLE layout_effects (id TEXT PRIMARY KEY)")
    inbox = onceonly.AsyncInbox(store, consumer="layout-report")

    async def handler(msg: Any, tx: Any) -> None:
        await tx.execute("INSERT INTO layout_effects (id) VALUES (?)", (msg["id"],))

    queue = f"onceonly-layout-report.{uuid.uuid4().hex[:12]}"
    calls: list[str] = []
    connection = await aio_pika.connect(AMQP_URL)
    try:
        async with RabbitMQConsumer(inbox, handler, url=AMQP_URL, queue=queue):
            channel = await connection.channel()
            for key in (f"warm-up-{uuid.uuid4().hex}", f"traced-{uuid.uuid4().hex}"):
                tracer.stopped = asyncio.Event()
                tracer.stop_on = ("aio_pika", "ack")
                traced = key.startswith("traced")
                if traced:
                    await asyncio.sleep(0.5)  # the warm-up's tail (after its ack) ends first
                    tracer.start()
                message = aio_pika.Message(
                    json.dumps({"id": key}).encode(),
                    message_id=key,
                    content_type="application/json",
                )
                await channel.default_exchange.publish(message, routing_key=queue)
                await asyncio.wait_for(tracer.stopped.wait(), timeout=30)
                if traced:
                    calls = list(tracer.stop())
            await asyncio.sleep(0.2)  # let the ack go out before the consumer stops
        async with store.session() as session:
            cur = await session.execute("SELECT count(*) FROM layout_effects")
            row = await cur.fetchone()
        if row is None or row[0] != 2:
            raise RuntimeError(f"expected 2 handled messages, found {row}")
    finally:
        channel = await connection.channel()
        for name in (queue, f"{queue}.dead"):
            await channel.queue_delete(name)
        await connection.close()
        await store.close()
    return calls


async def trace_http(tracer: Tracer, store_url: str) -> list[str]:
    """One POST through the ASGI IdempotencyMiddleware on PostgreSQL (leased mode)."""
    import httpx

    import onceonly
    from onceonly.http.asgi import IdempotencyMiddleware

    store = onceonly.open_async_store(store_url)
    await store.migrate()
    runs: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            event = await receive()
            body += event.get("body", b"")
            if not event.get("more_body"):
                break
        runs.append(body)
        answer = b'{"created": true}'
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(answer)).encode()),
        ]
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    guarded = IdempotencyMiddleware(app, store=store, principal=lambda request: "report")
    calls: list[str] = []
    try:
        transport = httpx.ASGITransport(app=guarded)
        async with httpx.AsyncClient(transport=transport, base_url="http://report") as client:
            for key in (f"warm-up-{uuid.uuid4().hex}", f"traced-{uuid.uuid4().hex}"):
                traced = key.startswith("traced")
                if traced:
                    await asyncio.sleep(0.5)  # what the warm-up left running ends first
                    tracer.start()
                r = await client.post("/orders", json={"id": key}, headers={"Idempotency-Key": key})
                if traced:
                    calls = list(tracer.stop())
                if r.status_code != 201 or "idempotent-replayed" in r.headers:
                    raise RuntimeError(f"POST answered {r.status_code}: {r.text}")
            # the response was stored: the same request again is a replay
            r = await client.post("/orders", json={"id": key}, headers={"Idempotency-Key": key})
            if r.headers.get("idempotent-replayed") != "true":
                raise RuntimeError(f"no replay: {r.status_code} {r.headers}")
        if len(runs) != 2:
            raise RuntimeError(f"expected 2 handled requests, found {len(runs)}")
    finally:
        await store.close()
    return calls


def run_runtime(src: Path, modules: dict[str, Module]) -> dict[str, Any]:
    """Sections 8a and 8b, on a database of their own, dropped afterwards."""
    sys.path.insert(0, str(src.parent))
    import psycopg

    import onceonly

    where = Path(onceonly.__file__).resolve().parent
    if where != src.resolve():
        raise RuntimeError(f"imported onceonly from {where}, not from {src}")
    database = f"onceonly_layout_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    store_url = f"postgresql://postgres@127.0.0.1:5432/{database}"
    tracer = Tracer()
    sys.setprofile(tracer)
    try:
        rabbit = asyncio.run(trace_rabbitmq(tracer, store_url))
        http = asyncio.run(trace_http(tracer, store_url))
    finally:
        sys.setprofile(None)
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    return {
        "rabbitmq": summarise_trace(rabbit, modules),
        "http": summarise_trace(http, modules),
    }


# ----------------------------------------------------------------------------- duplicates


def duplicates(src: Path) -> dict[str, Any]:
    tool = shutil.which("duplicates")
    if not tool:
        return {"pairs": None, "line": "the duplicates command is not installed"}
    out = subprocess.run(
        [tool, "--repo", str(src), "--seconds", "120"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=src,
    ).stdout
    first = out.splitlines()[0] if out else ""
    m = re.match(r"(\d+) pairs", first)
    pairs = int(m.group(1)) if m else 0 if first.startswith("no duplicates") else None
    return {"pairs": pairs, "line": first}


# ----------------------------------------------------------------------------- report


RUNTIME = frozenset({"top", "function"})
IMPORT_SETS: list[tuple[str, frozenset[str]]] = [
    ("runtime", RUNTIME),
    ("+TYPE_CHECKING", RUNTIME | {"type_checking"}),
    ("module level only", frozenset({"top"})),
]
STYLE_ALLOWED = {("_core", "errors"), ("_core", "messaging")}  # STYLE §1


def graph_summary(
    modules: dict[str, Module], imports: list[Import], scale: str, kinds: frozenset[str]
) -> dict[str, Any]:
    graph = build_graph(modules, imports, scale, set(kinds))
    bad = against_layers(graph, modules, scale)
    return {
        "graph": graph,
        "nodes": len(graph.nodes),
        "arrows": len(graph.arrows),
        "upward": sum(x[4] == "up" for x in bad),
        "sideways": sum(x[4] == "sideways" for x in bad),
        "unknown": sum(x[4] == "unknown" for x in bad),
        "style_allowed": sum((x[2], x[3]) in STYLE_ALLOWED for x in bad),
        "against_layers": [
            f"{a} -> {b} ({ca} -> {cb}, {how})  e.g. {', '.join(graph.witnesses[(a, b)][:3])}"
            for a, b, ca, cb, how in bad
        ],
        "cycles": graph.cycles,
    }


def cycle_arrows(graph: Graph) -> list[list[str]]:
    """The arrows inside each cycle, with one import that makes each."""
    return [
        [
            f"{a} -> {b}  e.g. {graph.witnesses[(a, b)][0]}"
            for a, b in sorted(graph.arrows)
            if a in cycle and b in cycle
        ]
        for cycle in graph.cycles
    ]


def measure(src: Path, runtime: bool) -> dict[str, Any]:
    modules = load_modules(src)
    imports = find_imports(modules)
    root = sorted(m.file for m in modules.values() if len(m.rel) == 1 and not m.package)
    root.insert(0, "__init__.py")
    public = sorted(m.file for m in modules.values() if looks_public(m))
    statements: dict[str, int] = defaultdict(int)
    for imp in imports:
        statements[imp.kind] += 1

    scales = {
        (scale, label): graph_summary(modules, imports, scale, kinds)
        for scale in ("module", "twin", "package", "concept")
        for label, kinds in IMPORT_SETS
    }
    mod_rt = scales[("module", "runtime")]
    mod_tc = scales[("module", "+TYPE_CHECKING")]
    con_rt = scales[("concept", "runtime")]
    con_tc = scales[("concept", "+TYPE_CHECKING")]

    store_arrows = set()
    for imp in imports:
        a, b = modules[imp.src], modules[imp.dst]
        ba, bb = backend(a), backend(b)
        if ba and bb and ba != bb and "shared" not in (ba, bb) and imp.kind in RUNTIME:
            store_arrows.add(f"{a.file}:{imp.line} -> {b.file} ({ba} -> {bb})")

    claim, verdict = decision_dispatch(modules)
    claim_places = {fold_twin(c.split(" ")[0]) for c in claim}
    private = private_access(modules, imports)
    switches, store_probes, other_type_names = probes(modules)

    report: dict[str, Any] = {
        "src": str(src),
        "root_modules": root,
        "modules": len(modules),
        "public_modules": public,
        "module_graph": {
            **{k: v for k, v in mod_rt.items() if k != "graph"},
            "import_statements": dict(statements),
            "type_checking_only_arrows": sorted(
                f"{a} -> {b}" for a, b in mod_rt["graph"].type_checking_only
            ),
            "cycles_with_type_checking": mod_tc["cycles"],
            "scales": [
                {"scale": scale, "imports": label}
                | {k: v for k, v in summary.items() if isinstance(v, int)}
                | {"cycles": len(summary["cycles"])}
                for (scale, label), summary in scales.items()
            ],
        },
        "concept_graph": {
            **{k: v for k, v in con_rt.items() if k != "graph"},
            "concepts": con_rt["graph"].nodes,
            "arrow_list": sorted(f"{a} -> {b}" for a, b in con_rt["graph"].arrows),
            "cycle_arrows": cycle_arrows(con_rt["graph"]),
            "cycles_with_type_checking": con_tc["cycles"],
            "store_backend_arrows": sorted(store_arrows, key=_by_place),
        },
        "claim_dispatch": claim,
        "claim_dispatch_without_twins": len(claim_places),
        "verdict_dispatch": verdict,
        "private_access": {
            "cross": private.cross,
            "foreign": private.foreign,
            "imports": private.imports,
        },
        "type_name_switches": switches,
        "type_name_other_uses": other_type_names,
        "store_probes": store_probes,
        "duplicates": duplicates(src),
    }
    if runtime:
        try:
            report["runtime"] = run_runtime(src, modules)
        except Exception as exc:  # the static measures still stand
            report["runtime"] = {"error": f"{type(exc).__name__}: {exc}"}
    return report


def print_report(r: dict[str, Any], trace: bool = False) -> None:
    def out(text: str = "") -> None:
        print(text)

    def items(lines: Iterable[str], indent: str = "    ") -> None:
        for line in lines:
            out(f"{indent}{line}")

    out(f"layout of {r['src']}")
    out()
    out("1. Root modules: .py files directly in src/onceonly.")
    out(f"   {len(r['root_modules'])}: {' '.join(r['root_modules'])}")
    out()
    out(
        "2. Modules that look public: no path component starts with '_' (a dunder such as"
        " __main__ is not private; __init__.py counts as its package)."
    )
    out(f"   {len(r['public_modules'])} of {r['modules']} modules")
    out()
    g = r["module_graph"]
    out(
        "3. Import graph, module scale: a node per .py file; A -> B when A imports B anywhere"
        " in the file (module level or in a function), imports under TYPE_CHECKING apart;"
        " upward/sideways by the layers of section 4; a cycle is a strongly connected"
        " component of more than one node."
    )
    out(
        f"   {g['nodes']} modules, {g['arrows']} arrows, {g['upward']} pointing upward"
        f" ({g['style_allowed']} of them _core -> errors/messaging, which STYLE allows),"
        f" {g['sideways']} sideways, {len(g['cycles'])} cycles"
    )
    st = g["import_statements"]
    out(
        f"   onceonly imports: {st.get('top', 0)} at module level, {st.get('function', 0)} in"
        f" functions, {st.get('type_checking', 0)} under TYPE_CHECKING;"
        f" {len(g['type_checking_only_arrows'])} arrows only under TYPE_CHECKING,"
        f" {len(g['cycles_with_type_checking'])} cycles when they count"
    )
    out("   cycles:")
    items(f"[{len(c)}] {' '.join(c)}" for c in g["cycles"])
    out("   cycles when TYPE_CHECKING imports count:")
    items(f"[{len(c)}] {' '.join(c)}" for c in g["cycles_with_type_checking"])
    out("   arrows only under TYPE_CHECKING:")
    items(g["type_checking_only_arrows"])
    out("   arrows upward or sideways:")
    items(g["against_layers"])
    out(
        "   other scales: twin = x_async.py and its generated x.py as one node; package = a"
        " root module, or all the modules of one package directory; concept = section 4"
    )
    for c in g["scales"]:
        out(
            f"    {c['scale']:<8} {c['imports']:<18} {c['nodes']:>4} nodes {c['arrows']:>4} arrows"
            f" {c['upward']:>3} upward {c['sideways']:>3} sideways {c['cycles']:>3} cycles"
        )
    out()
    cg = r["concept_graph"]
    out(
        "4. Import graph, package scale: a node per concept package (a module kept at the"
        " root is its own). Layers: 0 _core; 1 errors types messaging events keys _acompat"
        " tracing prometheus testing; 2 stores; 3 inbox outbox admin (inbox may import"
        " outbox); 4 brokers http contrib dashboard; 5 cli demo __init__ __main__. Upward:"
        " to a higher layer; sideways: between two packages of layer 3 or 4."
    )
    out(
        f"   {cg['nodes']} packages, {cg['arrows']} arrows, {cg['upward']} upward"
        f" ({cg['style_allowed']} of them _core -> errors/messaging), {cg['sideways']}"
        f" sideways, {len(cg['cycles'])} cycles spanning packages"
        f" ({len(cg['cycles_with_type_checking'])} when TYPE_CHECKING imports count)"
    )
    items(cg["against_layers"])
    out("   cycles spanning packages:")
    for cycle, arrows in zip(cg["cycles"], cg["cycle_arrows"], strict=True):
        out(f"    {' '.join(cycle)}")
        items(arrows, indent="      ")
    out(
        "   imports from one store backend into another (shared parts aside):"
        f" {len(cg['store_backend_arrows'])}"
    )
    items(cg["store_backend_arrows"])
    out()
    out(
        "5. Places that dispatch a claim decision: functions that call _core's decide(), or"
        " branch on its Action (RUN, REPLAY, IN_FLIGHT, MISMATCH, DEAD) or on a claim's"
        " answer (isinstance/match on Decision, Replay, Claim, AsyncClaim)."
    )
    out(
        f"   {len(r['claim_dispatch'])} ({r['claim_dispatch_without_twins']} when a generated"
        " sync twin and its async source count once)"
    )
    items(r["claim_dispatch"])
    out(
        "   also, functions that branch on a settle verdict (_core.settle Action: ACK, RETRY,"
        f" DEAD_LETTER): {len(r['verdict_dispatch'])}"
    )
    items(r["verdict_dispatch"])
    out()
    pa = r["private_access"]
    out(
        "6. Private members used across packages: x._name (or getattr/hasattr/setattr with"
        " '_name'; x not self, cls or super(); no dunders) where _name is defined only in"
        " other concept packages; imports of another package's private names or private"
        " modules (_core's public modules and a package's own face are fine)."
    )
    out(
        f"   {len(pa['cross'])} accesses, {len(pa['imports'])} imports"
        f" (and {len(pa['foreign'])} accesses to private members of other libraries)"
    )
    out("   accesses:")
    items(pa["cross"])
    out("   imports:")
    items(pa["imports"])
    out("   private members of other libraries:")
    items(pa["foreign"])
    out()
    out(
        "7. Type-name switches and store probes: type(x).__name__ or x.__class__.__name__ in"
        " a comparison; getattr/hasattr on a store outside stores/."
    )
    out(
        f"   {len(r['type_name_switches'])} type-name comparisons"
        f" (other type-name uses, in messages: {r['type_name_other_uses']}),"
        f" {len(r['store_probes'])} store probes"
    )
    items(r["type_name_switches"])
    items(r["store_probes"])
    out()
    if "error" in r.get("runtime", {}):
        out(f"8. Runtime: failed: {r['runtime']['error']}")
    elif "runtime" in r:
        out(
            "8. Modules one message crosses at runtime: the onceonly modules whose functions"
            " start (sys.setprofile; a resumed coroutine is not a new call) while the second"
            " of two messages/requests is handled; package changes = concept changes between"
            " consecutive module entries."
        )
        runs = (
            (
                "a) RabbitMQ, arrival to ack: RabbitMQConsumer, atomic AsyncInbox, PostgreSQL",
                "rabbitmq",
            ),
            ("b) HTTP POST: ASGI IdempotencyMiddleware (leased), PostgreSQL", "http"),
        )
        for label, key in runs:
            t = r["runtime"][key]
            out(f"   {label}")
            out(
                f"     {t['distinct_modules']} modules, {t['package_changes']} package changes"
                f" ({t['module_entries']} module entries, {t['calls']} calls)"
            )
            out(f"     packages in first-seen order: {' '.join(t['concepts'])}")
            items(t["modules"], indent="       ")
            if trace:
                out("     every call, in order:")
                items(t["sequence"], indent="       ")
    else:
        out("8. Runtime: skipped (--no-runtime).")
    out()
    d = r["duplicates"]
    out("9. duplicates --repo src/onceonly: pairs of places that share 6 or more lines.")
    out(f"   {d['pairs']}  ({d['line']})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=DEFAULT_SRC, help="path to src/onceonly")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--no-runtime", action="store_true", help="skip section 8")
    parser.add_argument(
        "--trace", action="store_true", help="section 8 also lists every call (module:function)"
    )
    args = parser.parse_args(argv)
    src = args.src.resolve()
    if not (src / "__init__.py").is_file():
        parser.error(f"{src} is not the onceonly package")
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.dont_write_bytecode = True
    report = measure(src, runtime=not args.no_runtime)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report, trace=args.trace)
    return 1 if "error" in report.get("runtime", {}) else 0


if __name__ == "__main__":
    sys.exit(main())
