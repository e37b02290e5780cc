# SPDX-License-Identifier: MIT
"""Every HTTP quick start of the README names, just before its code, every package its
imports need (``pip install 'onceonly[fastapi]' httpx``): a reader who installs what it
says can run it. The snippet test runs the code; this one checks what it tells to install.
"""

from __future__ import annotations

import ast
import re
import sys

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

from tests.docs.test_snippets import ROOT, extract

SECTION = "## Quick start: HTTP"
_INSTALL = re.compile(r"pip install ([^`]+)`")


def _extras() -> dict[str, set[str]]:
    """Each onceonly extra's distribution names (lower case, no version)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    out: dict[str, set[str]] = {}
    for extra, requirements in project["optional-dependencies"].items():
        out[extra] = {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in requirements}
    return out


def _named(text: str) -> set[str]:
    """The distributions a ``pip install`` line names (extras expanded)."""
    extras = _extras()
    names: set[str] = set()
    for spec in _INSTALL.findall(text)[-1].split():
        spec = spec.strip("'\"")
        found = re.fullmatch(r"onceonly\[([a-z,]+)\]", spec)
        if found:
            for extra in found.group(1).split(","):
                names |= extras[extra]
        else:
            names.add(spec.lower())
    return names


def _imports(code: str) -> set[str]:
    tops: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            tops |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            tops.add(node.module.split(".")[0])
    return {t for t in tops if t not in sys.stdlib_module_names and t != "onceonly"}


def _quick_starts() -> list[tuple[int, str, str]]:
    """(line, the prose just before the block, the block) of the HTTP quick start."""
    readme = ROOT / "README.md"
    lines = readme.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(SECTION))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    out = []
    for snippet in extract(readme):
        if start < snippet.line < end:
            prose = []
            i = snippet.line - 2
            while i > start and not lines[i].startswith("```"):
                prose.append(lines[i])
                i -= 1
            out.append((snippet.line, "\n".join(reversed(prose)), snippet.code))
    return out


QUICK_STARTS = _quick_starts()


def test_there_are_http_quick_starts() -> None:
    """FastAPI, Flask and Django."""
    assert len(QUICK_STARTS) >= 3


@pytest.mark.parametrize(
    ("line", "prose", "code"), QUICK_STARTS, ids=[str(q[0]) for q in QUICK_STARTS]
)
def test_quick_start_names_every_package_it_imports(line: int, prose: str, code: str) -> None:
    """Every import outside the stdlib and onceonly is named by the pip line before it."""
    assert "pip install" in prose, f"README.md:{line}: no pip install line before the code"
    missing = _imports(code) - _named(prose)
    assert not missing, f"README.md:{line}: imports {sorted(missing)} the text does not name"
