# SPDX-License-Identifier: MIT
"""Redrive through the dashboard writes only what the operator was shown: a ``dry_run``
flag is read strictly, and a confirmed filtered redrive takes the set its dry run
counted, never records that died after the count."""

from __future__ import annotations

import html
import re
from typing import Any

import httpx
import pytest

import onceonly
from onceonly._core.state import State
from onceonly.dashboard import app
from tests.dashboard.conftest import TOKEN, put

BEARER = {"authorization": f"Bearer {TOKEN}"}


def client(asgi: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://dash")


async def kill(store: Any, key: str) -> None:
    await put(store, "pay", key, State.DEAD, attempts=5, error="RuntimeError: boom")


async def dead_count(store: Any) -> int:
    return len(await onceonly.AsyncAdmin(store).list_records(state=State.DEAD, limit=100))


def hidden_fields(page: str) -> dict[str, str]:
    found = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page)
    return {name: html.unescape(value) for name, value in found}


@pytest.mark.parametrize("value", ["1", "True", "TRUE", "on", "yes", " 1", "1 ", " On "])
async def test_a_true_dry_run_flag_in_any_spelling_writes_nothing(
    dash_store: Any, value: str
) -> None:
    """``dry_run=True`` (what ``requests`` sends for ``True``) is a dry run, not a redrive."""
    for i in range(3):
        await kill(dash_store, f"k{i}")
    async with client(app(dash_store, token=TOKEN)) as c:
        r = await c.post("/api/redrive", params={"state": "dead", "dry_run": value}, headers=BEARER)
    assert r.status_code == 200 and r.json()["dry_run"] is True and r.json()["matched"] == 3
    assert await dead_count(dash_store) == 3


@pytest.mark.parametrize("value", ["2", "maybe", "", "y", "truee"])
async def test_an_unknown_dry_run_flag_is_refused_naming_it(dash_store: Any, value: str) -> None:
    for i in range(3):
        await kill(dash_store, f"k{i}")
    async with client(app(dash_store, token=TOKEN)) as c:
        r = await c.post("/api/redrive", params={"state": "dead", "dry_run": value}, headers=BEARER)
    assert r.status_code == 400 and "dry_run" in r.json()["error"]
    assert await dead_count(dash_store) == 3


@pytest.mark.parametrize("value", ["0", "false", "OFF", " no "])
async def test_a_false_dry_run_flag_redrives(dash_store: Any, value: str) -> None:
    for i in range(3):
        await kill(dash_store, f"k{i}")
    async with client(app(dash_store, token=TOKEN)) as c:
        r = await c.post("/api/redrive", params={"state": "dead", "dry_run": value}, headers=BEARER)
    assert r.json() == {"dry_run": False, "redriven": 3}
    assert await dead_count(dash_store) == 0


async def test_confirmation_redrives_only_what_the_dry_run_counted(dash_store: Any) -> None:
    """Shown 3, five more die while the operator reads the page: confirming redrives 3."""
    for i in range(3):
        await kill(dash_store, f"a{i}")
    admin = onceonly.AsyncAdmin(dash_store)
    async with client(app(dash_store, token=TOKEN)) as c:
        await c.post("/login", data={"token": TOKEN})
        page = (await c.get("/redrive", params={"state": "dead", "scope": "pay"})).text
        assert 'id="match-count">3<' in page
        form = {**hidden_fields(page), "confirm": "yes"}
        for i in range(5):
            await kill(dash_store, f"b{i}")
        done = await c.post("/redrive", data=form)
        assert done.status_code == 303
        notice = (await c.get(done.headers["location"])).text
        assert re.search(r'id="notice">Redriven[^<]*\(3\)', notice)
    failed = await admin.list_records(state=State.FAILED, limit=100)
    assert sorted(r.key for r in failed) == ["a0", "a1", "a2"]
    dead = await admin.list_records(state=State.DEAD, limit=100)
    assert sorted(r.key for r in dead) == [f"b{i}" for i in range(5)]


async def test_confirmation_refuses_when_the_counted_set_changed(dash_store: Any) -> None:
    """One of the counted records was redriven and died again meanwhile: nothing is
    redriven, and the page says so and links to a new count."""
    for i in range(3):
        await kill(dash_store, f"a{i}")
    admin = onceonly.AsyncAdmin(dash_store)
    async with client(app(dash_store, token=TOKEN)) as c:
        await c.post("/login", data={"token": TOKEN})
        page = (await c.get("/redrive", params={"state": "dead"})).text
        form = {**hidden_fields(page), "confirm": "yes"}
        assert await admin.redrive("pay", "a0") is not None  # another operator
        refused = await c.post("/redrive", data=form)
        assert refused.status_code == 409
        assert "counted 3" in refused.text and 'id="error-link"' in refused.text
        assert await dead_count(dash_store) == 2
        link = re.findall(r'id="error-link" href="([^"]+)"', refused.text)
        link = re.findall(r'href="([^"]+)" id="error-link"', refused.text) or link
        recount = await c.get(html.unescape(link[0]))
        assert 'id="match-count">2<' in recount.text


async def test_confirmation_without_the_count_is_refused(dash_store: Any) -> None:
    await kill(dash_store, "a0")
    async with client(app(dash_store, token=TOKEN)) as c:
        await c.post("/login", data={"token": TOKEN})
        page = (await c.get("/redrive", params={"state": "dead"})).text
        form = {**hidden_fields(page), "confirm": "yes"}
        del form["count"]
        assert (await c.post("/redrive", data=form)).status_code == 400
    assert await dead_count(dash_store) == 1


async def test_api_redrive_of_a_counted_set(dash_store: Any) -> None:
    """The API's dry run answers ``before`` and ``expect``; a redrive that sends them
    back takes that set only, or nothing (409) when it changed."""
    for i in range(2):
        await kill(dash_store, f"a{i}")
    async with client(app(dash_store, token=TOKEN)) as c:
        dry = (
            await c.post("/api/redrive", params={"state": "dead", "dry_run": "1"}, headers=BEARER)
        ).json()
        assert dry["matched"] == dry["expect"] == 2
        await kill(dash_store, "late")
        counted = {"state": "dead", "before": repr(dry["before"]), "expect": "2"}
        r = await c.post("/api/redrive", params=counted, headers=BEARER)
        assert r.json() == {"dry_run": False, "redriven": 2}
        again = await c.post("/api/redrive", params=counted, headers=BEARER)
        assert again.status_code == 409 and again.json()["redriven"] == 0
        half = await c.post("/api/redrive", params={"state": "dead", "expect": "2"}, headers=BEARER)
        assert half.status_code == 400 and "before" in half.json()["error"]
    assert await dead_count(dash_store) == 1  # "late" was never counted


async def test_record_page_after_a_redrive_says_it_waits_for_the_next_delivery(
    dash_store: Any,
) -> None:
    """No red error box and no Redrive button once redriven; the old error is labelled."""
    await kill(dash_store, "a0")
    async with client(app(dash_store, token=TOKEN)) as c:
        await c.post("/login", data={"token": TOKEN})
        before = (await c.get("/records/pay/a0")).text
        assert 'id="redrive"' in before and 'class="error" id="record-error"' in before
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', before)
        assert csrf is not None
        await c.post("/records/pay/a0/redrive", data={"csrf": csrf.group(1)})
        after = (await c.get("/records/pay/a0")).text
    assert 'id="record-redriven">redriven, waiting for the next delivery' in after
    assert 'id="redrive"' not in after
    assert 'class="error" id="record-error"' not in after
    assert "Error before the redrive" in after and "RuntimeError: boom" in after
