# SPDX-License-Identifier: MIT
"""Every import the documentation shows works, from the module it names, without a warning.

References are collected from README.md, docs/**/*.md and examples/: ``from onceonly…
import …`` and ``import onceonly…`` (in code blocks and in prose), ``::: onceonly…``
(the API reference's mkdocstrings blocks) and quoted dotted paths into the package
(Django's settings name classes and functions that way). All are resolved in one fresh
interpreter with ``-W error``, so a reference that only works through the finder of
moved modules (a DeprecationWarning) fails. The moved paths themselves are checked last:
each still imports, warns, and gives the objects of the package that replaced it.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

import onceonly

ROOT = Path(__file__).resolve().parents[2]
_TOP = {p.stem for p in (ROOT / "src" / "onceonly").iterdir() if not p.stem.startswith(".")}
_FROM = re.compile(r"\bfrom\s+(onceonly(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n#`;]+)")
_IMPORT = re.compile(r"(?<![\w.])import\s+(onceonly(?:\.\w+)*)")
_RENDER = re.compile(r"^:::\s+(onceonly(?:\.\w+)*)\s*$")
_QUOTED = re.compile(r"[\"'](onceonly(?:\.\w+)+)[\"']")


@dataclass(frozen=True)
class Reference:
    where: str  # file:line
    module: str  # what to import
    name: str | None  # then take this attribute (or submodule) of it
    dotted: bool  # ``module`` is a dotted path whose tail may be attributes (:::, quoted)

    @property
    def id(self) -> str:
        shown = f"from {self.module} import {self.name}" if self.name else self.module
        return f"{self.where} {shown}"


def _names(clause: str) -> list[str]:
    """The names of an import clause: ``(A, B as C,\\n D)`` -> A, B, D."""
    found = []
    for part in clause.strip().strip("()\\").replace("\n", " ").split(","):
        name = part.strip().split(" as ")[0].strip()
        if name.isidentifier():
            found.append(name)
    return found


def _from_markdown(path: Path) -> list[Reference]:
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(ROOT)
    refs: list[Reference] = []

    def line(offset: int) -> str:
        return f"{rel}:{text.count(chr(10), 0, offset) + 1}"

    for match in _FROM.finditer(text):
        for name in _names(match.group(2)):
            refs.append(Reference(line(match.start()), match.group(1), name, False))
    for match in _IMPORT.finditer(text):
        refs.append(Reference(line(match.start()), match.group(1), None, False))
    offset = 0
    for row in text.splitlines(keepends=True):
        render = _RENDER.match(row)
        if render:
            refs.append(Reference(line(offset), render.group(1), None, True))
        offset += len(row)
    refs.extend(_quoted(text, line))
    return refs


def _quoted(text: str, line: Callable[[int], str]) -> list[Reference]:
    """Quoted dotted paths whose second part is a module of the package (not "onceonly.db")."""
    return [
        Reference(line(m.start()), m.group(1), None, True)
        for m in _QUOTED.finditer(text)
        if m.group(1).split(".")[1] in _TOP
    ]


def _from_python(path: Path) -> list[Reference]:
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(ROOT)
    refs: list[Reference] = []
    for node in ast.walk(ast.parse(text)):
        where = f"{rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] == "onceonly":
                refs.extend(Reference(where, node.module, a.name, False) for a in node.names)
        elif isinstance(node, ast.Import):
            refs.extend(
                Reference(where, a.name, None, False)
                for a in node.names
                if a.name.split(".")[0] == "onceonly"
            )
    refs.extend(_quoted(text, lambda offset: f"{rel}:{text.count(chr(10), 0, offset) + 1}"))
    return refs


def collect() -> list[Reference]:
    refs: list[Reference] = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        refs.extend(_from_markdown(doc))
    for example in sorted((ROOT / "examples").rglob("*")):
        if example.suffix == ".py":
            refs.extend(_from_python(example))
        elif example.suffix == ".md":
            refs.extend(_from_markdown(example))
    return refs


# Runs in a fresh interpreter with -W error: resolve each reference, report what failed.
_RESOLVE = r"""
import importlib, json, sys

def resolve(ref):
    if ref["dotted"]:
        parts = ref["module"].split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError as exc:
                if not (exc.name and (".".join(parts[:cut]) + ".").startswith(exc.name + ".")):
                    raise  # a module the path names imports something that is missing
                continue
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
            return
        raise ModuleNotFoundError(ref["module"])
    module = importlib.import_module(ref["module"])
    if ref["name"] and not hasattr(module, ref["name"]):
        importlib.import_module(ref["module"] + "." + ref["name"])

failed = {}
for ref in json.load(sys.stdin):
    try:
        resolve(ref)
    except BaseException as exc:
        failed[ref["id"]] = f"{type(exc).__name__}: {exc}"
print(json.dumps(failed))
"""

REFERENCES = collect()


def _resolve(refs: list[Reference]) -> dict[str, str]:
    payload = json.dumps([{**asdict(r), "id": r.id} for r in refs])
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", _RESOLVE],
        input=payload,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, str] = json.loads(proc.stdout.splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def failures() -> dict[str, str]:
    return _resolve(REFERENCES)


def test_references_are_found() -> None:
    """Each kind of reference is collected (a broken pattern would pass vacuously)."""
    ids = {r.id for r in REFERENCES}
    assert any("import onceonly" not in i and i.endswith(" onceonly.brokers.kafka") for i in ids)
    assert any(i.startswith("README.md:") and " from onceonly" in i for i in ids)
    assert any(i.startswith("examples/") for i in ids)
    assert any(i.endswith(" onceonly.contrib.django.middleware.IdempotencyMiddleware") for i in ids)
    assert not any(i.endswith(" onceonly.db") for i in ids)


def test_the_resolver_reports_a_moved_path_and_a_missing_name() -> None:
    """A path that only the finder of moved modules serves fails, as does a wrong name."""
    bad = [
        Reference("x.md:1", "onceonly.stores.postgres_async", "AsyncPostgresStore", False),
        Reference("x.md:2", "onceonly.inbox", "NoSuchName", False),
        Reference("x.md:3", "onceonly.stores.postgres.NoSuchStore", None, True),
        Reference("x.md:4", "onceonly.stores.postgres.PostgresStore.migrate", None, True),
    ]
    got = _resolve(bad)
    assert set(got) == {r.id for r in bad[:3]}
    assert got[bad[0].id].startswith("DeprecationWarning: onceonly.stores.postgres_async moved")


def test_names_of_an_import_clause() -> None:
    """Parenthesised, aliased and continued clauses give their names."""
    assert _names("(\n    Inbox,\n    Tx as T,\n)") == ["Inbox", "Tx"]
    assert _names("open_store, open_async_store  ") == ["open_store", "open_async_store"]
    assert _names("…") == []


@pytest.mark.parametrize("ref", REFERENCES, ids=[r.id for r in REFERENCES])
def test_documented_import_works(ref: Reference, failures: dict[str, str]) -> None:
    """The reference resolves from the path the documentation gives."""
    assert ref.id not in failures, failures[ref.id]


# What each moved module exported (its __all__ before the move) that its package still
# exports. Dropped with the move, being internals: inbox_batch(_async).process_batch,
# SCHEMA_VERSION and the *Session classes of the postgres, mysql and redis stores, and
# tiered_async's STORE_ID, AsyncTieredAdmin and AsyncTieredSession.
OLD_NAMES = {
    "onceonly.admin_async": [
        "AsyncAdmin",
        "DuplicateCounter",
        "DuplicatePoint",
        "DuplicateRecorder",
        "LatenessReport",
        "PurgeReport",
        "ReapReport",
        "StatsReport",
        "admin_store_async",
    ],
    "onceonly.decorator": ["idempotent"],
    "onceonly.http.principals": ["remote_user", "scope_user"],
    "onceonly.inbox_async": ["AsyncInbox", "AsyncTx"],
    "onceonly.inbox_batch": ["BatchItem"],
    "onceonly.inbox_batch_async": ["BatchItem"],
    "onceonly.leased": ["Claim", "LeasedRunner", "Replay", "current_claim"],
    "onceonly.leased_async": ["AsyncClaim", "AsyncLeasedRunner", "Replay", "current_async_claim"],
    "onceonly.open": ["open_async_store", "open_store"],
    "onceonly.outbox_async": ["AsyncOutbox", "OutboxRow"],
    "onceonly.outcome": ["Outcome", "Replay"],
    "onceonly.relay": ["Relay", "RelayStats"],
    "onceonly.relay_async": ["AsyncRelay", "RelayStats"],
    "onceonly.stores.engine_pool": ["EngineConnections"],
    "onceonly.stores.engine_pool_async": ["AsyncEngineConnections"],
    "onceonly.stores.mysql_async": ["AsyncMySQLStore"],
    "onceonly.stores.mysql_engine": ["MySQLEngineStore"],
    "onceonly.stores.mysql_engine_async": ["AsyncMySQLEngineStore"],
    "onceonly.stores.postgres_async": ["AsyncPostgresStore"],
    "onceonly.stores.postgres_partitions": ["DroppedPartitions", "Partition", "PostgresPartitions"],
    "onceonly.stores.postgres_partitions_async": [
        "AsyncPostgresPartitions",
        "DroppedPartitions",
        "Partition",
    ],
    "onceonly.stores.postgres_psycopg2_engine": ["Psycopg2EngineStore"],
    "onceonly.stores.redis_store": ["RedisStore"],
    "onceonly.stores.redis_store_async": ["AsyncRedisStore"],
    "onceonly.stores.sqlite_engine": ["SQLiteEngineStore"],
    "onceonly.stores.threaded": ["ThreadedAsyncStore"],
    "onceonly.stores.tiered_async": ["AsyncRedisTier", "AsyncTieredStore", "LocalTier"],
    "onceonly.tx": ["Tx"],
    "onceonly.tx_async": ["AsyncTx"],
}

# Runs in a fresh interpreter per old path, so the finder is asked (nothing is cached).
_MOVED_CHECK = r"""
import importlib, json, sys, warnings
old, face, names = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    module = importlib.import_module(old)
    taken = {}
    for name in names:
        exec(f"from {old} import {name} as value", taken)
        taken[name] = taken.pop("value")
new = importlib.import_module(face)
print(json.dumps({
    "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
    "is_face": sorted(module.__all__) == sorted(new.__all__) and module.__name__ == old,
    "same": {name: taken[name] is getattr(new, name) for name in names},
}))
"""


def test_every_moved_path_is_checked() -> None:
    """The table above covers the finder's list exactly."""
    assert sorted(OLD_NAMES) == sorted(onceonly._MOVED)


@pytest.mark.parametrize("old", sorted(onceonly._MOVED))
def test_moved_path_imports_with_a_warning(old: str) -> None:
    """The old path warns once, names its package, and gives that package's objects."""
    face = onceonly._MOVED[old]
    proc = subprocess.run(
        [sys.executable, "-c", _MOVED_CHECK, old, face, json.dumps(OLD_NAMES.get(old, []))],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["warnings"] == [f"DeprecationWarning: {old} moved: import from {face} instead"]
    assert got["is_face"]
    assert got["same"] == dict.fromkeys(OLD_NAMES.get(old, []), True)
