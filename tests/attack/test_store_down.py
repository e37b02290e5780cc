"""When the store cannot serve (not migrated, database missing), the operator gets a
4xx/5xx page that says why (errors.md: NotMigrated/StoreUnavailable -> 503), with the
dashboard's security headers, not a bare text/plain "Internal Server Error"; and the
`onceonly dashboard` command refuses a PostgreSQL database that does not exist
(exit 2, docs/operating.md "Exit statuses") instead of serving 500s after 5 s each."""

import asyncio
import os
import socket
import subprocess
import sys
import uuid

import httpx

import onceonly
from onceonly.dashboard import app as dashboard


async def _get(url, path):
    store = onceonly.open_async_store(url)  # never migrated
    app = dashboard(store, token="t")
    try:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
            return await c.get(path)
    finally:
        await store.close()


def test_unmigrated_store_page_says_so(tmp_path):
    r = asyncio.run(_get(f"sqlite:///{tmp_path}/empty.db", "/"))
    assert r.status_code == 503, (r.status_code, r.text[:200])
    assert "migrate" in r.text
    assert "content-security-policy" in r.headers


def test_unmigrated_store_api_says_so(tmp_path):
    r = asyncio.run(_get(f"sqlite:///{tmp_path}/empty.db", "/api/summary"))
    assert r.status_code == 503, (r.status_code, r.text[:200])
    assert "migrate" in r.json()["error"]


def test_cli_refuses_a_missing_postgres_database():
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", 5432)) != 0:
            import pytest

            pytest.skip("no PostgreSQL on 127.0.0.1:5432")
    url = f"postgresql://postgres@127.0.0.1:5432/missing_{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "ONCEONLY_DASHBOARD_TOKEN": "t"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "onceonly", "dashboard", "--url", url, "--port", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        rc = proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 2, f"still serving after 20 s (rc={rc})"
