# SPDX-License-Identifier: MIT
"""An unreachable PostgreSQL fails fast and says why, naming host/port/database, never
the password, and prints no pool warnings on the way.

(This server trusts every TCP login, so "password authentication failed" cannot be
produced here; an unknown role is the authentication case we can reach.)
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time

import pytest

import onceonly
from tests.conftest import require_postgres

SECRET = "s3cret-do-not-print"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CASES = {
    "refused": (f"postgresql://postgres:{SECRET}@127.0.0.1:{_free_port()}/test", "refused"),
    "unknown-host": (f"postgresql://postgres:{SECRET}@nonexistent.invalid/test", "resolve"),
    "no-database": (
        f"postgresql://postgres:{SECRET}@127.0.0.1:5432/onceonly_no_such_db",
        'database "onceonly_no_such_db" does not exist',
    ),
    "unknown-role": (
        f"postgresql://onceonly_no_such_role:{SECRET}@127.0.0.1:5432/test",
        'role "onceonly_no_such_role" does not exist',
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sync_store_says_why_quickly(case: str) -> None:
    """The first use raises StoreUnavailable with the cause within the connect timeout."""
    require_postgres()
    url, cause = CASES[case]
    started = time.monotonic()
    store = onceonly.open_store(url, connect_timeout=2)
    try:
        with pytest.raises(onceonly.StoreUnavailable) as caught:
            store.migrate()
    finally:
        store.close()
    elapsed = time.monotonic() - started
    text = str(caught.value)
    assert cause in text, text
    assert "cannot connect to PostgreSQL" in text
    assert SECRET not in text
    assert elapsed < 15, f"took {elapsed:.1f}s"


@pytest.mark.parametrize("case", ["refused", "no-database"])
async def test_async_store_says_why_quickly(case: str) -> None:
    """The async store gives the same answer."""
    require_postgres()
    url, cause = CASES[case]
    store = onceonly.open_async_store(url, connect_timeout=2)
    try:
        with pytest.raises(onceonly.StoreUnavailable, match=cause) as caught:
            await store.migrate()
    finally:
        await store.close()
    assert SECRET not in str(caught.value)


def test_no_pool_warnings_reach_stderr() -> None:
    """A script without logging set up sees one error, not the pool's retry warnings."""
    url, _ = CASES["refused"]
    script = textwrap.dedent(
        f"""
        import onceonly
        store = onceonly.open_store({url!r}, connect_timeout=2)
        try:
            store.migrate()
        except onceonly.StoreUnavailable as exc:
            print("raised:", type(exc).__name__)
        store.close()
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.stdout.strip() == "raised: StoreUnavailable", proc
    assert proc.stderr == "", proc.stderr


def test_connect_timeout_is_validated() -> None:
    """A nonsensical timeout is a ConfigurationError, not a hang."""
    for bad in (0, -1, float("nan"), "5"):
        with pytest.raises(onceonly.ConfigurationError, match="connect_timeout"):
            onceonly.open_store("postgresql://postgres@127.0.0.1:5432/test", connect_timeout=bad)
