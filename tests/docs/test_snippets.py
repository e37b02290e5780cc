# SPDX-License-Identifier: MIT
"""Every ```python block of README.md and docs/**/*.md runs as written.

Each block runs as a script of its own in a fresh directory (a subprocess, bounded in
time), on SQLite; a block that opens ``sqlite:///onceonly.db`` runs again on
PostgreSQL, in a database of its own, with that URL replaced. The line just before a
fence may say ``<!-- snippet: skip -->`` (a fragment, not meant to run alone) or
``<!-- snippet: needs=redis -->`` (postgres, redis, rabbitmq, nats, mysql, kafka): such a
block runs only where that service is reachable, and fails in CI when it is not.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import PG_URL, require_postgres, unavailable

ROOT = Path(__file__).resolve().parents[2]
SQLITE_URL = "sqlite:///onceonly.db"
_FENCE = re.compile(r"^```python\s*$")
_MARK = re.compile(r"^<!--\s*snippet:\s*(skip|needs=([a-z,]+))\s*-->\s*$")
_PORTS = {"redis": 6379, "rabbitmq": 5672, "nats": 4222, "mysql": 3306, "kafka": 9092}
_TIMEOUT = 60


@dataclass(frozen=True)
class Snippet:
    path: str
    line: int
    code: str
    skip: bool
    needs: tuple[str, ...]


def extract(path: Path, root: Path = ROOT) -> list[Snippet]:
    """The ```python blocks of one Markdown file, with the marker before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Snippet] = []
    i = 0
    while i < len(lines):
        if _FENCE.match(lines[i]):
            start = i
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            if j == len(lines):
                raise AssertionError(f"{path}:{start + 1}: unclosed ```python fence")
            mark = _MARK.match(lines[start - 1]) if start > 0 else None
            skip = bool(mark and mark.group(1) == "skip")
            needs = tuple(mark.group(2).split(",")) if mark and mark.group(2) else ()
            rel = str(path.relative_to(root))
            code = "\n".join(lines[start + 1 : j]) + "\n"
            found.append(Snippet(rel, start + 1, code, skip, needs))
            i = j + 1
        else:
            i += 1
    return found


def all_snippets() -> list[Snippet]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [s for f in files if f.exists() for s in extract(f)]


SNIPPETS = all_snippets()


def _reachable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def _require(needs: tuple[str, ...]) -> None:
    for service in needs:
        if service == "postgres":
            require_postgres()
        elif service in _PORTS:
            if not _reachable(_PORTS[service]):
                unavailable(f"{service} on 127.0.0.1:{_PORTS[service]}")
        else:
            raise AssertionError(f"unknown service {service!r} in a snippet marker")


def run(code: str, cwd: Path) -> None:
    script = cwd / "snippet.py"
    script.write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=_TIMEOUT,
        check=False,
    )
    assert proc.returncode == 0, (
        f"the snippet exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n"
        f"{proc.stderr}"
    )


def _ids(snippets: list[Snippet]) -> list[str]:
    return [f"{s.path}:{s.line}" for s in snippets]


RUNNABLE = [s for s in SNIPPETS if not s.skip]
ON_POSTGRES = [s for s in RUNNABLE if SQLITE_URL in s.code]


def test_the_docs_have_runnable_snippets() -> None:
    """The extraction finds the README's quick starts (a broken parser would pass vacuously)."""
    readme = [s for s in RUNNABLE if s.path == "README.md"]
    assert len(readme) >= 2, readme


@pytest.mark.parametrize("snippet", RUNNABLE, ids=_ids(RUNNABLE))
def test_snippet_runs_on_sqlite(snippet: Snippet, tmp_path: Path) -> None:
    """The block runs as written, in a fresh directory."""
    _require(snippet.needs)
    run(snippet.code, tmp_path)


@pytest.mark.parametrize("snippet", ON_POSTGRES, ids=_ids(ON_POSTGRES))
def test_snippet_runs_on_postgres(snippet: Snippet, tmp_path: Path) -> None:
    """The same block with its SQLite URL pointed at a fresh PostgreSQL database."""
    _require(snippet.needs)
    require_postgres()
    import psycopg

    name = f"snippet_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        url = PG_URL.rsplit("/", 1)[0] + "/" + name
        run(snippet.code.replace(SQLITE_URL, url), tmp_path)
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_markers_are_understood(tmp_path: Path) -> None:
    """skip and needs= markers are read from the line before a fence, nowhere else."""
    doc = tmp_path / "x.md"
    doc.write_text(
        "<!-- snippet: skip -->\n```python\nraise SystemExit(1)\n```\n\n"
        "<!-- snippet: needs=redis,nats -->\n```python\npass\n```\n"
        "<!-- snippet: skip -->\n\n```python\nprint(1)\n```\n",
        encoding="utf-8",
    )
    got = extract(doc, root=tmp_path)
    assert [(s.line, s.skip, s.needs) for s in got] == [
        (2, True, ()),
        (7, False, ("redis", "nats")),
        (12, False, ()),
    ]


def test_a_failing_snippet_fails(tmp_path: Path) -> None:
    """The runner reports a block that raises (so a broken quick start cannot pass)."""
    with pytest.raises(AssertionError, match="no such table"):
        run(
            "import sqlite3\nsqlite3.connect('x.db').execute('SELECT * FROM ledger')\n",
            tmp_path,
        )
