# SPDX-License-Identifier: MIT
"""Sessions end when the operator logs out (a copied cookie stops working), logging out
needs the form's CSRF field, notices come only from the dashboard's own redirects, and a
login's ``next`` stays inside the dashboard when it is mounted."""

from __future__ import annotations

import re
from typing import Any

import httpx
from fastapi import FastAPI

import onceonly
from onceonly._core.state import State
from onceonly.dashboard import app
from tests.dashboard.conftest import TOKEN, put

COOKIE = "onceonly_dashboard"


def client(asgi: Any, cookies: dict[str, str] | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=asgi), base_url="http://dash", cookies=cookies
    )


async def login(c: httpx.AsyncClient, path: str = "/records/pay/k") -> tuple[str, str]:
    """Log in; the cookie and the CSRF field of ``path``."""
    await c.post("/login", data={"token": TOKEN})
    cookie = c.cookies.get(COOKIE)
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', (await c.get(path)).text)
    assert cookie and found
    return cookie, found.group(1)


async def state(store: Any) -> State | None:
    record = await onceonly.AsyncAdmin(store).show("pay", "k")
    return None if record is None else record.state


async def test_a_cookie_copied_before_logout_is_refused_after_it(dash_store: Any) -> None:
    await put(dash_store, "pay", "k", State.DEAD, attempts=1, error="boom")
    asgi = app(dash_store, token=TOKEN)
    async with client(asgi) as c:
        cookie, csrf = await login(c)
        out = await c.post("/logout", data={"csrf": csrf})
        assert out.status_code == 303
    async with client(asgi, cookies={COOKIE: cookie}) as stolen:
        r = await stolen.post("/records/pay/k/redrive", data={"csrf": csrf})
        assert r.status_code == 403 and "logged out" in r.text
        page = (await stolen.get("/records/pay/k")).text
        assert 'id="redrive"' not in page and "Log in" in page
    assert await state(dash_store) is State.DEAD


async def test_logout_without_the_csrf_field_is_refused(dash_store: Any) -> None:
    """A cross-site form cannot log the operator out; the session keeps working."""
    await put(dash_store, "pay", "k", State.DEAD, attempts=1, error="boom")
    async with client(app(dash_store, token=TOKEN)) as c:
        _, csrf = await login(c)
        assert (await c.post("/logout")).status_code == 403
        assert (await c.post("/logout", data={"csrf": "0" * 64})).status_code == 403
        r = await c.post("/records/pay/k/redrive", data={"csrf": csrf})
        assert r.status_code == 303
    assert await state(dash_store) is State.FAILED


async def test_the_logout_button_carries_the_csrf_field(dash_store: Any) -> None:
    await put(dash_store, "pay", "k", State.DEAD, attempts=1, error="boom")
    async with client(app(dash_store, token=TOKEN)) as c:
        _, csrf = await login(c)
        page = (await c.get("/")).text
        form = re.search(r'<form method="post" action="/logout">(.*?)</form>', page)
        assert form is not None and f'name="csrf" value="{csrf}"' in form.group(1)


async def test_a_new_dashboard_process_forgets_the_sessions(dash_store: Any) -> None:
    """Sessions live in memory (documented): a restart logs everyone out."""
    await put(dash_store, "pay", "k", State.DEAD, attempts=1, error="boom")
    async with client(app(dash_store, token=TOKEN)) as c:
        cookie, csrf = await login(c)
    async with client(app(dash_store, token=TOKEN), cookies={COOKIE: cookie}) as after:
        r = await after.post("/records/pay/k/redrive", data={"csrf": csrf})
        assert r.status_code == 403
    assert await state(dash_store) is State.DEAD


async def test_a_notice_in_a_link_made_elsewhere_shows_nothing(dash_store: Any) -> None:
    """``/records?done=redrive&n=99999`` claims nothing; the redirect's own notice shows."""
    await put(dash_store, "pay", "k", State.DEAD, attempts=1, error="boom")
    async with client(app(dash_store, token=TOKEN)) as c:
        spoof = (await c.get("/records", params={"done": "redrive", "n": "99999"})).text
        assert 'id="notice"' not in spoof and "(99999)" not in spoof
        _, csrf = await login(c)
        done = await c.post("/records/pay/k/redrive", data={"csrf": csrf})
        location = done.headers["location"]
        assert 'id="notice">Redriven' in (await c.get(location)).text
        forged = location.replace("done=redrive", "done=delete")
        assert 'id="notice"' not in (await c.get(forged)).text
        bigger = (await c.get(location + "&n=99999")).text  # n is signed too
        assert "(99999)" not in bigger and "Redriven" not in bigger


async def test_login_next_stays_under_the_mount(dash_store: Any) -> None:
    outer = FastAPI()
    outer.mount("/ops", app(dash_store, token=TOKEN))
    async with client(outer) as c:
        for outside in ("/", "/admin", "/opsx/records", "/ops/../admin", "/ops/%2e%2e/admin"):
            r = await c.post("/ops/login", data={"token": TOKEN, "next": outside})
            assert r.headers["location"].startswith("/ops/?done=login&"), outside
            page = (await c.get("/ops/login", params={"next": outside})).text
            assert 'name="next" value=""' in page, outside
        target = "/ops/records?state=dead"
        inside = await c.post("/ops/login", data={"token": TOKEN, "next": target})
        assert inside.headers["location"] == "/ops/records?state=dead"
