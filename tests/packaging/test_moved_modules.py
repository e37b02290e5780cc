# SPDX-License-Identifier: MIT
"""Old module paths (``onceonly.leased``, ``onceonly.stores.threaded``, ...) import through
a finder that warns: the package face they point to keeps its own name and spec (a
dependency that imports an old path must not break ``find_spec``, ``importlib.resources``
or ``reload`` of the face), and the warning names the caller's line also for
``importlib.import_module``. Each case runs in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

Run = Callable[[str], subprocess.CompletedProcess[str]]
SRC = Path(__file__).resolve().parents[2] / "src"


def run(code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def fresh() -> Run:
    return run


def test_find_spec_of_face_keeps_its_name(
    fresh: Callable[[str], subprocess.CompletedProcess[str]],
) -> None:
    r = fresh(
        "import warnings; warnings.simplefilter('ignore')\n"
        "import importlib.util as u\n"
        "import onceonly.inbox\n"
        "import onceonly.leased\n"
        "print(u.find_spec('onceonly.inbox').name)\n"
        "print(u.find_spec('onceonly.inbox_async').name)\n"
    )
    assert r.returncode == 0, r.stderr
    # the face keeps its spec; the old path is a module of its own
    assert r.stdout.split() == ["onceonly.inbox", "onceonly.inbox_async"]


def test_face_spec_is_untouched(fresh: Run) -> None:
    r = fresh(
        "import warnings; warnings.simplefilter('ignore')\n"
        "import onceonly.stores\n"
        "import onceonly.stores.threaded\n"
        "s = onceonly.stores.__spec__\n"
        "print(s.name, s.origin is not None, s.submodule_search_locations is not None)\n"
    )
    assert r.returncode == 0, r.stderr
    # before the fix: "onceonly.stores.threaded False False"
    assert r.stdout.split() == ["onceonly.stores", "True", "True"]


def test_importlib_resources_on_face_after_old_import(
    fresh: Callable[[str], subprocess.CompletedProcess[str]],
) -> None:
    r = fresh(
        "import warnings; warnings.simplefilter('ignore')\n"
        "import importlib.resources as res\n"
        "import onceonly.stores.threaded\n"
        "print(len(list(res.files('onceonly.stores').iterdir())) > 0)\n"
    )
    # before the fix: TypeError: 'onceonly.stores' is not a package
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"


def test_reload_face_after_old_import(
    fresh: Callable[[str], subprocess.CompletedProcess[str]],
) -> None:
    r = fresh(
        "import warnings, importlib; warnings.simplefilter('ignore')\n"
        "import onceonly.inbox as face\n"
        "import onceonly.leased\n"
        "face.Inbox = None\n"
        "importlib.reload(face)\n"
        "print(face.Inbox is not None, face.__name__, face.__package__)\n"
    )
    assert r.returncode == 0, r.stderr
    # before the fix: "False onceonly.leased onceonly": the face is not re-executed and is renamed
    assert r.stdout.split() == ["True", "onceonly.inbox", "onceonly.inbox"]


def test_import_module_warning_is_shown_by_default(
    fresh: Callable[[str], subprocess.CompletedProcess[str]],
) -> None:
    r = fresh("import importlib\nimportlib.import_module('onceonly.tx')\n")
    assert r.returncode == 0, r.stderr
    assert "onceonly.tx moved" in r.stderr  # now: nothing printed


def test_import_module_warning_points_at_caller(
    fresh: Callable[[str], subprocess.CompletedProcess[str]],
) -> None:
    r = fresh(
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    importlib.import_module('onceonly.open')\n"
        "print(w[0].filename)\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "<string>", r.stdout  # now: .../importlib/__init__.py
