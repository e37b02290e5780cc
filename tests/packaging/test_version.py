# SPDX-License-Identifier: MIT
"""The version is defined once (``onceonly.__version__``) and every place reports it."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import onceonly

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_pep440() -> None:
    """``__version__`` is a plain release (or pre-release) version string."""
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.dev\d+)?", onceonly.__version__)


def test_installed_metadata_agrees() -> None:
    """The installed distribution's version is the one in ``onceonly/__init__.py``."""
    assert importlib.metadata.version("onceonly") == onceonly.__version__


def test_cli_reports_the_version() -> None:
    """``onceonly --version`` prints the same version."""
    script = Path(sys.executable).with_name("onceonly")
    out = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["onceonly", onceonly.__version__]


def test_version_is_defined_once() -> None:
    """pyproject.toml takes the version from the package instead of repeating it."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'dynamic = ["version"]' in pyproject
    assert not re.search(r"(?m)^version\s*=", pyproject)
