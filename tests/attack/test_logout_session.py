"""Logging out must end the session: the cookie captured before logout must not
authorise a write afterwards (today it does, for the rest of its 12 hours)."""

import asyncio
import re

import httpx
import pytest

import onceonly
from onceonly.dashboard import app as dashboard


async def _scenario(tmp_path):
    store = onceonly.open_async_store(f"sqlite:///{tmp_path}/s.db")
    await store.migrate()
    inbox = onceonly.AsyncInbox(store, consumer="pay", max_attempts=1)

    async def handler(msg, tx):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        await inbox.process("k", {}, handler)
    app = dashboard(store, token="t")
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
            await c.post("/login", data={"token": "t", "next": "/"})
            cookie = c.cookies.get("onceonly_dashboard")
            csrf = re.search(r'name="csrf" value="([^"]+)"', (await c.get("/records/pay/k")).text).group(1)
            await c.post("/logout", data={"csrf": csrf})
        async with httpx.AsyncClient(transport=transport, base_url="http://x", cookies={"onceonly_dashboard": cookie}) as stolen:
            r = await stolen.post("/records/pay/k/redrive", data={"csrf": csrf})
            state = (await stolen.get("/api/records/pay/k")).json()["state"]
    finally:
        await store.close()
    return r, state


def test_cookie_from_before_logout_is_refused(tmp_path):
    r, state = asyncio.run(_scenario(tmp_path))
    assert r.status_code in (401, 403), r.status_code
    assert state == "dead"
