# SPDX-License-Identifier: MIT
"""Changelog fragments are named so towncrier collects them, and the draft builds."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
FRAGMENTS = ROOT / "changelog.d"
NOT_FRAGMENTS = {"README.md", "template.md.jinja"}


def _types() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return {t["directory"] for t in config["tool"]["towncrier"]["type"]}


def test_fragment_names() -> None:
    """Every fragment is ``<issue>[.<topic>].<type>.md`` or ``+<name>.<type>.md``."""
    pattern = re.compile(r"(\+[\w-]+|\d+(\.[\w-]+)?)\.(?P<type>\w+)\.md")
    bad = []
    for path in FRAGMENTS.iterdir():
        if path.name in NOT_FRAGMENTS:
            continue
        match = pattern.fullmatch(path.name)
        if match is None or match["type"] not in _types():
            bad.append(path.name)
    assert not bad, f"fragments towncrier would not collect: {bad}; see changelog.d/README.md"


def test_draft_builds(tmp_path: Path) -> None:
    """``towncrier build --draft`` renders every pending fragment without error."""
    towncrier = Path(sys.executable).with_name("towncrier")
    assert towncrier.exists(), "towncrier comes with the dev extra"
    shutil.copytree(FRAGMENTS, tmp_path / "changelog.d")
    for name in ("pyproject.toml", "CHANGELOG.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "src" / "onceonly").mkdir(parents=True)
    shutil.copy(ROOT / "src/onceonly/__init__.py", tmp_path / "src/onceonly/__init__.py")
    out = subprocess.run(
        [str(towncrier), "build", "--draft", "--version", "9.9.9", "--date", "2000-01-01"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    pending = [p for p in FRAGMENTS.iterdir() if p.name not in NOT_FRAGMENTS]
    for path in pending:
        first_words = " ".join(path.read_text(encoding="utf-8").split()[:4])
        assert first_words in " ".join(out.stdout.split()), path.name


def test_changelog_has_the_current_release() -> None:
    """CHANGELOG.md has an entry for the version being released, or fragments for it."""
    import onceonly

    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "<!-- towncrier release notes start -->" in changelog
    released = f"## {onceonly.__version__} (" in changelog
    pending = any(p.name not in NOT_FRAGMENTS for p in FRAGMENTS.iterdir())
    assert released or pending
