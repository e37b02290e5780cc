# SPDX-License-Identifier: MIT
"""The sdist and the wheel build, pass ``twine check --strict`` and carry what users need."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest

import onceonly

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: the backend (hatchling) comes with the dev extra, so no download.
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def test_twine_check(dist: Path) -> None:
    """``twine check --strict`` accepts both files (metadata and README render)."""
    files = sorted(str(p) for p in dist.iterdir())
    assert len(files) == 2, files
    out = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_wheel_contents_and_metadata(dist: Path) -> None:
    """The wheel has the typing marker, the license and the metadata users see on PyPI."""
    (wheel,) = dist.glob("*.whl")
    assert wheel.name == f"onceonly-{onceonly.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        info = f"onceonly-{onceonly.__version__}.dist-info"
        meta = HeaderParser().parsestr(zf.read(f"{info}/METADATA").decode())
    assert "onceonly/py.typed" in names
    assert f"{info}/licenses/LICENSE" in names
    assert not [n for n in names if "/tests/" in n or n.startswith("tests/")]
    assert meta["Version"] == onceonly.__version__
    assert meta["License-Expression"] == "MIT"
    assert meta["Requires-Python"] == ">=3.10"
    classifiers = meta.get_all("Classifier") or []
    for version in ("3.10", "3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {version}" in classifiers
    assert "Typing :: Typed" in classifiers
    urls = meta.get_all("Project-URL") or []
    assert any(u.startswith("Changelog, ") for u in urls)
    extras = set(meta.get_all("Provides-Extra") or [])
    assert {"postgres", "rabbitmq", "nats", "redis", "all"} <= extras


def test_sdist_contents(dist: Path) -> None:
    """The sdist carries the sources, tests, docs, license and changelog, and no venv."""
    (sdist,) = dist.glob("*.tar.gz")
    prefix = f"onceonly-{onceonly.__version__}/"
    with tarfile.open(sdist) as tf:
        names = {n.removeprefix(prefix) for n in tf.getnames()}
    for needed in ("LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml", "mkdocs.yml"):
        assert needed in names
    assert "src/onceonly/__init__.py" in names
    assert "docs/index.md" in names
    assert not [n for n in names if n.startswith((".venv", "site/", "dist/"))]
