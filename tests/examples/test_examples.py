# SPDX-License-Identifier: MIT
"""The examples in examples/ run, and print what the README says they do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(name: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_inbox_example(tmp_path: Path) -> None:
    """The inbox example charges once, replays the redelivery and writes one outbox row."""
    out = run("inbox_sqlite.py", str(tmp_path / "x.db"))
    assert "first: {'charged': 500} replayed=False" in out
    assert "again: {'charged': 500} replayed=True" in out
    assert "ledger rows: 1; outbox: {'pending': 1, 'dead': 0}" in out


def test_idempotent_example() -> None:
    """The leased example calls the provider once and replays the stored result."""
    out = run("idempotent_sqlite.py")
    assert out.strip() == "{'payment': 'pay_1'} {'payment': 'pay_1'} provider charges: 1"


def test_webhook_inbox_example(tmp_path: Path) -> None:
    """A GitHub redelivery replays by its delivery header; a Stripe retry by its event id."""
    out = run("webhook_inbox.py", str(tmp_path / "w.db"))
    assert "github first: 200 replayed=False" in out
    assert "github redelivery: 200 replayed=True" in out
    assert "stripe retry: {'handled': 'payment_intent.succeeded', 'replayed': True}" in out
    assert "events: {'github': 1, 'stripe': 1}" in out


def test_django_rest_framework_example(tmp_path: Path) -> None:
    """DRF token clients: a retry replays, the key on another order is 422, another
    client's same key runs apart, an anonymous keyed request is 403; two charges."""
    out = run("django_rest_framework.py", str(tmp_path / "drf.db"))
    assert "first: 201 {'order': 1, 'charged': 5, 'charge': 1}" in out
    assert "retry: 201 {'order': 1, 'charged': 5, 'charge': 1} replayed: true" in out
    assert "same key, order 2: 422 key-mismatch" in out
    assert "bob, same key: 201 {'order': 3, 'charged': 9, 'charge': 2}" in out
    assert "anonymous: 403 no-principal" in out
    assert "charges: [('alice', 1, 5), ('bob', 3, 9)]" in out
