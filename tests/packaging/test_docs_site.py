# SPDX-License-Identifier: MIT
"""The API reference covers every public name; every page is in the site's navigation.

``make docs`` builds the site with ``mkdocs build --strict`` (broken links, unknown
references and docstring warnings fail it); these checks catch what a build cannot see.
"""

from __future__ import annotations

import re
from pathlib import Path

import onceonly

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _documented() -> set[str]:
    """The objects rendered by ``::: path`` blocks of the API reference."""
    names: set[str] = set()
    for page in (DOCS / "api").glob("*.md"):
        names.update(re.findall(r"(?m)^::: ([\w.]+)", page.read_text(encoding="utf-8")))
    return names


def test_every_public_name_is_in_the_api_reference() -> None:
    """Each name of ``onceonly.__all__`` has its entry (or its whole module has one)."""
    documented = _documented()
    missing = []
    for name in onceonly.__all__:
        module = getattr(onceonly, name).__module__
        face = module.split("._", 1)[0]  # the package whose __init__ exports it
        if not {f"onceonly.{name}", module, face} & documented:
            missing.append(name)
    assert not missing, f"add to docs/api/*.md: {missing}"


def test_every_broker_module_is_in_the_api_reference() -> None:
    """Each public module of ``onceonly.brokers`` is rendered whole."""
    modules = {
        f"onceonly.brokers.{p.stem}"
        for p in (ROOT / "src/onceonly/brokers").glob("*.py")
        if not p.name.startswith("_")
    }
    assert modules <= _documented()


def test_every_page_is_in_the_navigation() -> None:
    """A page under docs/ that the nav of mkdocs.yml does not list is unreachable."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1]
    nav = nav.split("\n\n", 1)[0]
    listed = set(re.findall(r"([\w/.-]+\.md)\s*$", nav, flags=re.MULTILINE))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages - listed == set(), "add these pages to the nav in mkdocs.yml"
