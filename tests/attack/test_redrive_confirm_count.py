"""The filtered redrive page counts N ("Redrive 3"), the operator confirms; records
that became dead after that dry run must not be redriven by that confirmation.

Today the confirmation re-runs the filter: 3 shown, 8 redriven.
"""

import asyncio
import html
import re

import httpx
import pytest

import onceonly
from onceonly.dashboard import app as dashboard


async def _scenario(tmp_path):
    store = onceonly.open_async_store(f"sqlite:///{tmp_path}/rd.db")
    await store.migrate()
    inbox = onceonly.AsyncInbox(store, consumer="pay", max_attempts=1)

    async def handler(msg, tx):
        raise RuntimeError("boom")

    async def kill(key):
        with pytest.raises(RuntimeError):
            await inbox.process(key, {"k": key}, handler)

    for i in range(3):
        await kill(f"a{i}")
    app = dashboard(store, token="t")
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
            await c.post("/login", data={"token": "t", "next": "/"})
            page = await c.get("/redrive", params={"state": "dead", "scope": "pay"})
            shown = int(re.search(r'id="match-count">(\d+)<', page.text).group(1))
            form = {k: html.unescape(v) for k, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.text)}
            form["confirm"] = "yes"
            for i in range(5):  # five more die while the operator reads the page
                await kill(f"b{i}")
            await c.post("/redrive", data=form)
            later = {}
            for i in range(5):
                later[f"b{i}"] = (await c.get(f"/api/records/pay/b{i}")).json()["state"]
            by_state = (await c.get("/api/summary")).json()["by_state"]
    finally:
        await store.close()
    return shown, later, by_state


def test_confirmation_redrives_no_more_than_the_dry_run_showed(tmp_path):
    shown, later, by_state = asyncio.run(_scenario(tmp_path))
    assert shown == 3
    assert by_state["failed"] <= shown, f"confirmed {shown}, redriven {by_state['failed']}"
    assert set(later.values()) == {"dead"}, later
