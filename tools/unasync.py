# SPDX-License-Identifier: MIT
"""Generate the sync twins of the async sources (``x_async.py`` -> ``x.py``).

Usage: python tools/unasync.py [--check]

Rewrites are whole-word and listed in RULES; ``Awaitable[X]`` becomes ``X``. A line
ending in ``# unasync: remove`` is dropped, and ``# unasync: add CODE`` becomes ``CODE``.
``--check`` fails when a generated file differs from its source, or a rule is unused.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [
    "src/onceonly/inbox/_tx_async.py",
    "src/onceonly/inbox/_events_async.py",
    "src/onceonly/inbox/_claim_async.py",
    "src/onceonly/inbox/_leased_async.py",
    "src/onceonly/inbox/_leased_inbox_async.py",
    "src/onceonly/inbox/_atomic_async.py",
    "src/onceonly/http/_flow_async.py",
    "src/onceonly/stores/postgres/_session_async.py",
    "src/onceonly/stores/postgres/_transaction_async.py",
    "src/onceonly/stores/postgres/_store_async.py",
    "src/onceonly/outbox/_outbox_async.py",
    "src/onceonly/outbox/_wake_async.py",
    "src/onceonly/outbox/_relay_async.py",
    "src/onceonly/stores/postgres/_admin_async.py",
    "src/onceonly/stores/postgres/_partitions_async.py",
    "src/onceonly/stores/postgres/_schema_async.py",
    "src/onceonly/stores/postgres/_pool_async.py",
    "src/onceonly/stores/postgres/_listen_async.py",
    "src/onceonly/admin/_admin_async.py",
    "src/onceonly/stores/redis/_store_async.py",
    "src/onceonly/stores/tiered/_store_async.py",
    "src/onceonly/stores/mysql/_session_async.py",
    "src/onceonly/stores/mysql/_store_async.py",
    "src/onceonly/stores/mysql/_admin_async.py",
    "src/onceonly/stores/_engine_pool_async.py",
    "src/onceonly/stores/mysql/_engine_async.py",
]

RULES: list[tuple[str, str]] = [
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\basleep\b", "sleep"),
    (r"\bagather\b", "gather"),
    (r"\basync for\b", "for"),
    (r"\basynccontextmanager\b", "contextmanager"),
    (r"\benter_async_context\b", "enter_context"),
    (r"\bAbstractAsyncContextManager\b", "AbstractContextManager"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bcurrent_async_claim\b", "current_claim"),
    (r"\b(\w+)_async\b", r"\1"),
    (r"\bAsync([A-Z]\w*)", r"\1"),
]

BANNER = "# This file was generated from {src} by tools/unasync.py: do not edit it.\n"


def _strip_awaitable(text: str) -> str:
    out, i = [], 0
    marker = "Awaitable["
    while True:
        j = text.find(marker, i)
        if j < 0 or (j > 0 and (text[j - 1].isalnum() or text[j - 1] == "_")):
            if j < 0:
                out.append(text[i:])
                return "".join(out)
            out.append(text[i : j + len(marker)])
            i = j + len(marker)
            continue
        out.append(text[i:j])
        depth, k = 1, j + len(marker)
        while depth:
            depth += {"[": 1, "]": -1}.get(text[k], 0)
            k += 1
        out.append(_strip_awaitable(text[j + len(marker) : k - 1]))
        i = k


def convert(text: str, used: set[str]) -> str:
    lines = []
    for line in text.splitlines(keepends=True):
        if line.rstrip().endswith("# unasync: remove"):
            continue
        m = re.match(r"^(\s*)# unasync: add (.*)$", line)
        if m:
            lines.append(f"{m.group(1)}{m.group(2)}\n")
            continue
        lines.append(line)
    out = "".join(lines)
    for pattern, repl in RULES:
        new = re.sub(pattern, repl, out)
        if new != out:
            used.add(pattern)
        out = new
    out = _strip_awaitable(out)
    out = re.sub(r"^from collections\.abc import (.*)$", _tidy_abc, out, flags=re.M)
    return out


def _tidy_abc(m: re.Match[str]) -> str:
    names = [n.strip() for n in m.group(1).split(",")]
    seen: list[str] = []
    for n in names:
        if n and n not in seen and n != "Awaitable":
            seen.append(n)
    return f"from collections.abc import {', '.join(sorted(seen))}"


def _format(text: str, target: Path) -> str:
    """Sort imports and ``ruff format`` the generated text, so it is lint-stable."""
    ruff = str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        ruff = shutil.which("ruff") or "ruff"
    for args in (["check", "--fix-only", "--select", "I"], ["format"]):
        text = subprocess.run(
            [ruff, *args, "--stdin-filename", str(target), "-"],
            input=text,
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout
    return text


def target_of(src: str) -> Path:
    return ROOT / src.replace("_async.py", ".py")


def main(argv: list[str]) -> int:
    check = "--check" in argv
    used: set[str] = set()
    failed = False
    for src in SOURCES:
        path = ROOT / src
        if not path.exists():
            continue
        body = convert(path.read_text(), used)
        lines = body.splitlines(keepends=True)
        # banner goes after the SPDX line
        generated = lines[0] + BANNER.format(src=Path(src).name) + "".join(lines[1:])
        target = target_of(src)
        generated = _format(generated, target)
        if check:
            if not target.exists() or target.read_text() != generated:
                print(f"unasync: {target.relative_to(ROOT)} is out of date; run tools/unasync.py")
                failed = True
        else:
            target.write_text(generated)
    if check:
        unused = [p for p, _ in RULES if p not in used]
        if unused:
            print(f"unasync: unused rules: {unused}")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
