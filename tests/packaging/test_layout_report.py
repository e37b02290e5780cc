# SPDX-License-Identifier: MIT
"""tools/layout_report.py measures a layout it has never seen: a small package built here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "layout_report.py"

FILES = {
    "__init__.py": "from onceonly.inbox import Inbox\n",
    "errors.py": "class OnceOnlyError(Exception): ...\n",
    "types.py": "class Store: ...\n",
    "_outbox_sql.py": "DDL = 'CREATE TABLE outbox ()'\n",
    "_core/__init__.py": "",
    "_core/state.py": """
        import enum
        from dataclasses import dataclass

        from onceonly.errors import OnceOnlyError

        class Action(enum.Enum):
            RUN = 'run'
            REPLAY = 'replay'

        @dataclass
        class Decision:
            action: Action

        def decide() -> Decision:
            return Decision(Action.RUN)
    """,
    "inbox.py": """
        from typing import TYPE_CHECKING

        from onceonly._core.state import Action, decide
        from onceonly.stores import memory

        if TYPE_CHECKING:
            from onceonly.types import Store

        class Inbox:
            def __init__(self) -> None:
                self._renew = None

            def process(self) -> None:
                from onceonly import outbox

                if decide().action is Action.REPLAY:
                    return
    """,
    "outbox.py": "from onceonly.inbox import Inbox\n",
    "stores/__init__.py": "",
    "stores/memory.py": """
        from onceonly import _outbox_sql
        from onceonly._core.state import Decision
    """,
    "stores/_postgres_sql.py": "from onceonly.stores import memory\n",
    "http/__init__.py": "",
    "http/asgi.py": """
        def serve(store, runner):
            runner._renew()
            if type(store).__name__ == 'PostgresStore':
                return getattr(store, 'dialect', None)
            raise ValueError(type(store).__name__)
    """,
}


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("layout_report", TOOL)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["layout_report"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    src = tmp_path_factory.mktemp("tree") / "src" / "onceonly"
    for name, text in FILES.items():
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    result: dict[str, Any] = load_tool().measure(src, runtime=False)
    return result


def test_root_and_public_modules(report: dict[str, Any]) -> None:
    assert report["root_modules"] == [
        "__init__.py",
        "_outbox_sql.py",
        "errors.py",
        "inbox.py",
        "outbox.py",
        "types.py",
    ]
    assert report["modules"] == len(FILES)
    # private: _outbox_sql, _core (package and its module), stores/_postgres_sql
    assert len(report["public_modules"]) == len(FILES) - 4


def test_module_graph(report: dict[str, Any]) -> None:
    g = report["module_graph"]
    # a function-level import counts; a TYPE_CHECKING one is set apart
    assert g["cycles"] == [["inbox.py", "outbox.py"]]
    assert g["type_checking_only_arrows"] == ["inbox.py -> types.py"]
    assert g["import_statements"] == {"top": 8, "function": 1, "type_checking": 1}
    assert g["arrows"] == 9
    assert any(
        x.startswith("stores/memory.py -> _outbox_sql.py (stores -> outbox, up)")
        for x in g["against_layers"]
    )
    assert any(
        x.startswith("_core/state.py -> errors.py (_core -> errors, up)")
        for x in g["against_layers"]
    )
    assert g["style_allowed"] == 1


def test_concept_graph(report: dict[str, Any]) -> None:
    cg = report["concept_graph"]
    # _outbox_sql belongs to outbox: inbox -> stores -> outbox -> inbox
    assert cg["cycles"] == [["inbox", "outbox", "stores"]]
    # inbox -> outbox is allowed; outbox -> inbox is sideways
    assert [x.split("  e.g.")[0] for x in cg["against_layers"]] == [
        "_core -> errors (_core -> errors, up)",
        "outbox -> inbox (outbox -> inbox, sideways)",
        "stores -> outbox (stores -> outbox, up)",
    ]
    assert cg["store_backend_arrows"] == [
        "stores/_postgres_sql.py:1 -> stores/memory.py (postgres -> memory)"
    ]


def test_claim_dispatch(report: dict[str, Any]) -> None:
    assert report["claim_dispatch"] == ["inbox.py:Inbox.process (Action, decide())"]


def test_private_access_and_probes(report: dict[str, Any]) -> None:
    pa = report["private_access"]
    assert pa["cross"] == ["http/asgi.py:3 runner._renew (defined in inbox)"]
    assert pa["imports"] == ["stores/memory.py:2 onceonly._outbox_sql"]
    assert report["type_name_switches"] == [
        "http/asgi.py:4 type(store).__name__ == 'PostgresStore'"
    ]
    assert report["type_name_other_uses"] == 1
    assert report["store_probes"] == ["http/asgi.py:5 getattr(store, 'dialect', None)"]


def test_runs_on_this_checkout() -> None:
    out = subprocess.run(
        [sys.executable, str(TOOL), "--json", "--no-runtime"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    report = json.loads(out)
    assert report["modules"] == len(list((ROOT / "src" / "onceonly").rglob("*.py")))
    assert report["module_graph"]["arrows"] > report["concept_graph"]["arrows"] > 0


@pytest.mark.parametrize(
    ("path", "concept", "backend", "private"),
    [
        # the flat layout
        ("inbox_leased_async.py", "inbox", None, False),
        ("_sqlalchemy.py", "inbox", None, True),
        ("relay_wake.py", "outbox", None, False),
        ("_admin_common.py", "admin", None, True),
        ("doctor_rabbitmq.py", "cli", None, False),
        ("_engine.py", "stores", "shared", True),
        ("stores/_tiers.py", "stores", "tiered", True),
        ("stores/engine_pool_async.py", "stores", "shared", False),
        ("_acompat.py", "_acompat", None, False),
        ("__main__.py", "__main__", None, False),
        # the package layout
        ("inbox/_claim.py", "inbox", None, True),
        ("stores/postgres/__init__.py", "stores", "postgres", False),
        ("stores/postgres/_sql.py", "stores", "postgres", True),
        ("stores/redis/store_async.py", "stores", "redis", False),
        ("_core/state.py", "_core", None, False),
        ("cli/__init__.py", "cli", None, False),
    ],
)
def test_concepts(path: str, concept: str, backend: str | None, private: bool) -> None:
    tool = load_tool()
    parts = tuple(path.removesuffix(".py").split("/"))
    package = parts[-1] == "__init__"
    rel = parts[:-1] if package else parts
    mod = tool.Module(".".join(("onceonly", *rel)), rel, path, None, package)
    assert tool.concept(mod) == concept
    assert tool.backend(mod) == backend
    # private to its package: another package may not import it
    assert any(tool.is_private(p) for p in tool.inner_parts(mod)) is private
