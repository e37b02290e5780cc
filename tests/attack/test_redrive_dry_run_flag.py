"""POST /api/redrive: a dry_run value the API does not understand must never write.

`requests.post(url, params={"dry_run": True})` sends `dry_run=True`; today that (and
`on`, `2`, ` 1`) is read as "not a dry run" and every matching record is redriven.
"""

import asyncio

import httpx
import pytest

import onceonly
from onceonly.dashboard import app as dashboard


async def _scenario(tmp_path, value):
    store = onceonly.open_async_store(f"sqlite:///{tmp_path}/dry.db")
    await store.migrate()
    inbox = onceonly.AsyncInbox(store, consumer="pay", max_attempts=1)

    async def handler(msg, tx):
        raise RuntimeError("boom")

    for i in range(3):
        with pytest.raises(RuntimeError):
            await inbox.process(f"k{i}", {"i": i}, handler)
    app = dashboard(store, token="t")
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
            r = await c.post(
                "/api/redrive",
                params={"state": "dead", "scope": "pay", "dry_run": value},
                headers={"Authorization": "Bearer t"},
            )
            dead = (await c.get("/api/summary")).json()["by_state"]["dead"]
    finally:
        await store.close()
    return r, dead


@pytest.mark.parametrize("value", ["True", "TRUE", "on", "2", " 1", "1 ", "maybe"])
def test_unrecognised_dry_run_value_writes_nothing(tmp_path, value):
    r, dead = asyncio.run(_scenario(tmp_path, value))
    # Either understood as a dry run, or refused; never a real bulk redrive.
    assert r.status_code == 400 or r.json().get("dry_run") is True, r.text
    assert dead == 3, f"dry_run={value!r} redrove {3 - dead} records: {r.text}"
