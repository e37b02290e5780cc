# SPDX-License-Identifier: MIT
"""The API reference covers every public name; every page is in the site's navigation.

``make docs`` builds the site with ``mkdocs build --strict`` (broken links, unknown
references and docstring warnings fail it); these checks catch what a build cannot see.
"""

from __future__ import annotations

import importlib
import re
import sys
import types
from pathlib import Path

import onceonly
from tests.packaging.test_faces import PUBLIC
from tests.packaging.test_layout import private_owner

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


# Public modules that the API reference does not render: the root re-exports the faces
# (checked name by name below), the command line is documented as commands, and these
# packages export nothing of their own.
NOT_RENDERED = {
    "onceonly",
    "onceonly.cli",
    "onceonly.contrib",
    "onceonly.contrib.django",
    "onceonly.demo",
}


def _blocks() -> list[tuple[str, str, list[str] | None]]:
    """The ``::: path`` blocks of the API reference: (page, path, its ``members:`` or None)."""
    found: list[tuple[str, str, list[str] | None]] = []
    for page in sorted((DOCS / "api").glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            match = re.match(r"^::: ([\w.]+)\s*$", line)
            if not match:
                continue
            members: list[str] | None = None
            for option in lines[i + 1 :]:
                if not option.startswith(" "):
                    break
                if option.strip() == "members:":
                    members = []
                elif members is not None and option.strip().startswith("- "):
                    members.append(option.strip()[2:].strip())
            found.append((page.name, match.group(1), members))
    return found


def _documented() -> set[str]:
    """The paths rendered: each block's path, and for a module, each member it renders."""
    names: set[str] = set()
    for _, path, members in _blocks():
        names.add(path)
        module = sys.modules.get(path) or _module(path)
        if module is not None:
            names.update(f"{path}.{m}" for m in (members or module.__all__))
    return names


def _module(path: str) -> types.ModuleType | None:
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError:
        return None


def test_blocks_render_public_faces() -> None:
    """A block names a public path (no ``_`` part), and a module's ``members:`` come from
    its ``__all__`` (the rest of a module is private, even when it has no ``_``)."""
    for page, path, members in _blocks():
        assert private_owner(path) is None, f"{page}: {path} is private; render its face"
        module = _module(path)
        if module is not None and members is not None:
            extra = sorted(set(members) - set(module.__all__))
            assert extra == [], f"{page}: {path} does not export {extra}"


def test_every_face_is_rendered_whole() -> None:
    """Each public module's ``__all__`` is rendered, across the pages."""
    documented = _documented()
    missing = sorted(
        f"{face}.{name}"
        for face in PUBLIC
        if face not in NOT_RENDERED
        for name in importlib.import_module(face).__all__
        if f"{face}.{name}" not in documented
    )
    assert missing == [], "add to docs/api/*.md (render the face, or add to its members:)"


def test_every_public_name_is_in_the_api_reference() -> None:
    """Each name of ``onceonly.__all__`` is rendered by a face that exports the same object."""
    documented = _documented()
    missing = []
    for name in onceonly.__all__:
        value = getattr(onceonly, name)
        faces = [
            path.rsplit(".", 1)[0]
            for path in documented
            if path.rsplit(".", 1)[-1] == name and "." in path
        ]
        if not any(getattr(_module(face), name, None) is value for face in faces if _module(face)):
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
