# SPDX-License-Identifier: MIT
"""A store that cannot serve: every page and API call answers 503 saying what to do (JSON
for the API, a page with the security headers for the rest), an unreachable store costs
at most ``store_timeout`` once and then nothing for a few seconds, and ``onceonly
dashboard`` refuses to start on a database that does not exist (exit 2)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

import onceonly
from onceonly.dashboard import app
from tests.conftest import PG_URL, require_postgres, unique_table
from tests.dashboard.conftest import TOKEN

BEARER = {"authorization": f"Bearer {TOKEN}"}


def client(asgi: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=asgi, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://dash")


@pytest.fixture(params=["sqlite", "postgres"])
async def unmigrated(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "postgres":
        require_postgres()
        store = onceonly.open_async_store(PG_URL, table=unique_table())
    else:
        store = onceonly.open_async_store(f"sqlite:///{tmp_path / 'empty.db'}")
    yield store
    await store.close()


@pytest.mark.parametrize("path", ["/", "/records", "/records/pay/k", "/redrive?state=dead"])
async def test_an_unmigrated_store_page_says_to_migrate(unmigrated: Any, path: str) -> None:
    async with client(app(unmigrated, token=TOKEN)) as c:
        r = await c.get(path)
    assert r.status_code == 503, (r.status_code, r.text[:200])
    assert r.headers["content-type"].startswith("text/html")
    assert "onceonly migrate" in r.text
    assert "content-security-policy" in r.headers and r.headers["x-frame-options"] == "DENY"


@pytest.mark.parametrize(
    "method, path",
    [("GET", "/api/summary"), ("GET", "/api/records"), ("GET", "/api/records/pay/k"),
     ("POST", "/api/records/pay/k/redrive"), ("POST", "/api/redrive?state=dead")],
)  # fmt: skip
async def test_an_unmigrated_store_api_says_to_migrate(
    unmigrated: Any, method: str, path: str
) -> None:
    async with client(app(unmigrated, token=TOKEN)) as c:
        r = await c.request(method, path, headers=BEARER)
    assert r.status_code == 503
    assert r.json()["code"] == "not-migrated" and "onceonly migrate" in r.json()["error"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_an_unreachable_store_answers_503_within_the_timeout() -> None:
    """Nothing listens on the port: the first read waits ``store_timeout`` (1 s, not the
    pool's 5 s), the next ones answer at once; a write never starts meanwhile."""
    url = f"postgresql://postgres@127.0.0.1:{_closed_port()}/nothing"
    store = onceonly.open_async_store(url)
    try:
        async with client(app(store, token=TOKEN, store_timeout=1.0)) as c:
            started = time.monotonic()
            first = await c.get("/api/summary")
            took = time.monotonic() - started
            assert first.status_code == 503 and first.json()["code"] == "store-timeout"
            assert took < 2.5, took
            started = time.monotonic()
            page = await c.get("/records")
            write = await c.post("/api/records/pay/k/redrive", headers=BEARER)
            assert time.monotonic() - started < 0.5
            assert page.status_code == 503 and "check the database" in page.text
            assert "content-security-policy" in page.headers and "retry-after" in page.headers
            assert write.status_code == 503
            assert "127.0.0.1" not in page.text + write.text  # no connection details
    finally:
        await store.close()


def test_store_timeout_must_be_positive(tmp_path: Path) -> None:
    store = onceonly.open_async_store(f"sqlite:///{tmp_path / 'x.db'}")
    with pytest.raises(onceonly.ConfigurationError, match="store_timeout"):
        app(store, store_timeout=0)


def _run_cli(url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ONCEONLY_DASHBOARD_TOKEN": TOKEN}
    return subprocess.run(
        [sys.executable, "-m", "onceonly", "dashboard", "--url", url, "--port", "0"],
        env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_cli_refuses_a_postgres_database_that_does_not_exist() -> None:
    require_postgres()
    base = PG_URL.rsplit("/", 1)[0]
    done = _run_cli(f"{base}/missing_{uuid.uuid4().hex[:8]}")
    assert done.returncode == 2, done.stderr
    assert "does not exist" in done.stderr and "http://" not in done.stdout


def test_cli_refuses_an_unmigrated_sqlite_store(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    done = _run_cli(f"sqlite:///{path}")
    assert done.returncode == 2, done.stderr
    assert "migrate" in done.stderr and "http://" not in done.stdout


def test_cli_exits_3_on_an_unreachable_store() -> None:
    done = _run_cli(f"postgresql://postgres@127.0.0.1:{_closed_port()}/nothing")
    assert done.returncode == 3, done.stderr
