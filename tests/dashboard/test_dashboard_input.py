# SPDX-License-Identifier: MIT
"""Bad query values answer 400 naming the parameter, before any store is asked: never a
500, and never 200 with the value quietly changed. NUL is refused everywhere (PostgreSQL
refuses it in text; SQLite's search matches it in every error)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

import onceonly
from onceonly._core.state import State
from onceonly.dashboard import app
from tests.dashboard.conftest import TOKEN, put

BEARER = {"authorization": f"Bearer {TOKEN}"}


async def ask(store: Any, method: str, path: str, params: Any = None) -> httpx.Response:
    await put(store, "pay", "k", State.DEAD, attempts=5, error="RuntimeError: boom")
    transport = httpx.ASGITransport(app=app(store, token=TOKEN), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash") as c:
        return await c.request(method, path, params=params, headers=BEARER)


async def dead(store: Any) -> int:
    return len(await onceonly.AsyncAdmin(store).list_records(state=State.DEAD))


@pytest.mark.parametrize("limit", ["-1", "0", "501", "100000", "abc"])
@pytest.mark.parametrize("path", ["/api/records", "/api/outbox"])
async def test_a_limit_outside_1_to_500_is_refused(dash_store: Any, path: str, limit: str) -> None:
    r = await ask(dash_store, "GET", path, {"limit": limit})
    assert r.status_code == 400 and "limit" in r.json()["error"]


async def test_the_records_page_shows_a_bad_limit(dash_store: Any) -> None:
    r = await ask(dash_store, "GET", "/records", {"limit": "-1"})
    assert "limit must be between 1 and 500" in r.text


@pytest.mark.parametrize(
    "params, word",
    [({"age": "zz"}, "age"), ({"age": "99999999999d"}, "age"), ({"limit": "abc"}, "limit"),
     ({"limit": "0"}, "limit"), ({"dry_run": "maybe"}, "dry_run")],
)  # fmt: skip
async def test_a_redrive_error_names_the_bad_value(
    dash_store: Any, params: dict[str, str], word: str
) -> None:
    r = await ask(dash_store, "POST", "/api/redrive", {"state": "dead", "dry_run": "1", **params})
    assert r.status_code == 400 and word in r.json()["error"], r.json()
    assert "state=dead" not in r.json()["error"]
    assert await dead(dash_store) == 1


@pytest.mark.parametrize("page", ["/redrive", "/api/records"])
async def test_a_huge_age_is_refused(dash_store: Any, page: str) -> None:
    r = await ask(dash_store, "GET", page, {"state": "dead", "age": "99999999999d"})
    assert r.status_code == 400 and "age" in r.text


async def test_a_nul_search_does_not_redrive_every_record(dash_store: Any) -> None:
    """On SQLite ``q=\\x00`` matched every error, so this redrove them all."""
    r = await ask(dash_store, "POST", "/api/redrive", {"state": "dead", "q": "\x00"})
    assert r.status_code == 400 and "q" in r.json()["error"]
    assert await dead(dash_store) == 1


NUL_CASES = [
    ("GET", "/api/records", {"q": "\x00"}),
    ("GET", "/api/records", {"key": "a\x00"}),
    ("GET", "/api/records", {"scope": "\x00"}),
    ("GET", "/records", {"q": "\x00"}),
    ("GET", "/redrive", {"state": "dead", "q": "\x00"}),
    ("GET", "/api/records/%00/x", None),
    ("GET", "/records/pay/k%00", None),
    ("POST", "/api/records/pay/%00/redrive", None),
    ("POST", "/api/outbox/%00/redrive", None),
    ("POST", "/api/redrive", {"state": "dead", "dry_run": "1", "q": "\x00"}),
]


@pytest.mark.parametrize("method, path, params", NUL_CASES, ids=[str(c) for c in NUL_CASES])
async def test_nul_anywhere_is_a_quick_400(
    dash_store: Any, method: str, path: str, params: Any
) -> None:
    started = time.monotonic()
    r = await ask(dash_store, method, path, params)
    assert r.status_code == 400, (r.status_code, r.text[:200])
    assert "NUL" in r.text and time.monotonic() - started < 2
    assert await dead(dash_store) == 1


@pytest.mark.parametrize(
    "path, form",
    [("/redrive", {"state": "dead", "q": "\x00", "confirm": "yes"}), ("/outbox", {"id": "\x00"})],
)
async def test_a_nul_in_a_form_is_refused(dash_store: Any, path: str, form: Any) -> None:
    await put(dash_store, "pay", "k", State.DEAD, attempts=5, error="boom")
    transport = httpx.ASGITransport(app=app(dash_store, token=TOKEN), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash") as c:
        r = await c.post(path, data=form, headers=BEARER)
    assert r.status_code == 400 and "NUL" in r.text
    assert await dead(dash_store) == 1


@pytest.mark.parametrize("path", ["/", "/api/summary"])
async def test_an_unknown_window_is_refused(dash_store: Any, path: str) -> None:
    r = await ask(dash_store, "GET", path, {"window": "2h"})
    assert r.status_code == 400 and "2h" in r.text and "is not one of 1h, 6h, 24h, 7d" in r.text
