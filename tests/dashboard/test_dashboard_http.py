# SPDX-License-Identifier: MIT
"""The dashboard over HTTP (no browser): the JSON API, the pages' links and escaping,
and who may write (401/403 and nothing changed), on SQLite and PostgreSQL."""

from __future__ import annotations

import re
import time
import urllib.parse
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

import onceonly
from onceonly._core.lateness import HALF_TTL, NEAR_TTL, RAN
from onceonly._core.state import State
from onceonly.dashboard import app
from tests.dashboard.conftest import TOKEN, put, seed

BEARER = {"authorization": f"Bearer {TOKEN}"}


def client(asgi: Any, base: str = "http://dash") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url=base)


def q(text: str) -> str:
    return urllib.parse.quote(text, safe="")


async def state_of(store: Any, scope: str, key: str) -> State | None:
    record = await onceonly.AsyncAdmin(store).show(scope, key)
    return None if record is None else record.state


async def test_summary_counts_by_state_and_scope(dash_store: Any) -> None:
    """GET /api/summary and the overview show the seeded counts."""
    await seed(dash_store)
    async with client(app(dash_store)) as c:
        body = (await c.get("/api/summary")).json()
        page = (await c.get("/")).text
    assert body["total"] == 9
    assert body["by_state"] == {"in_progress": 1, "completed": 5, "failed": 1, "dead": 2}
    assert body["by_scope"] == {
        "billing": {"in_progress": 1, "completed": 3, "failed": 1, "dead": 2},
        "shipping": {"in_progress": 0, "completed": 2, "failed": 0, "dead": 0},
    }
    assert (body["failed"], body["dead"]) == (1, 2)
    assert body["oldest_in_progress_seconds"]["billing"] >= 0
    assert body["outbox"] == {"pending": 0, "dead": 0, "lag_seconds": None}
    assert 'id="total">9<' in page and 'id="count-dead">2<' in page


async def test_duplicate_rate_is_drawn_from_the_counters_only(dash_store: Any) -> None:
    """No counters: the overview says so; counted deliveries: the rate per scope."""
    await seed(dash_store)
    async with client(app(dash_store)) as c:
        empty = (await c.get("/")).text
        assert 'id="duplicate-rate-empty"' in empty and "<svg" not in empty
        admin = onceonly.AsyncAdmin(dash_store)
        bucket = int(time.time()) // 60 * 60
        await admin.records.add_counts([("billing", bucket, 8, 2)])  # a counter's flush
        body = (await c.get("/api/summary")).json()
        page = (await c.get("/")).text
    last = body["duplicates"]["intervals"][-1]["scopes"]
    assert last == {"billing": {"claims": 8, "replays": 2, "rate": 0.25}}
    assert 'id="duplicate-rate"' in page and "25.0%" in page
    assert body["lateness"] is None and 'id="lateness-empty"' in page
    assert body["duplicates"]["source"] == "DuplicateCounter" and "Fallback" in page


async def test_lateness_histogram_and_rate_from_the_recorder(dash_store: Any) -> None:
    """Recorded buckets: the overview draws one bar per lateness bin with its count, the
    ttl marked, and the duplicate rate from the same buckets (not the fallback)."""
    await seed(dash_store)
    admin = onceonly.AsyncAdmin(dash_store)
    bucket = int(time.time()) // 60 * 60
    await admin.records.add_counts([("billing", bucket, 100, 99)])  # the fallback: unused
    await admin.records.add_lateness(
        [
            ("billing", bucket, RAN, 6, None),
            ("billing", bucket, 1, 3, 3600.0),  # < 1 s
            ("billing", bucket, 4, 2, 3600.0),  # < 10 min
            ("billing", bucket, NEAR_TTL, 1, 3600.0),
            ("shipping", bucket, HALF_TTL, 2, 7200.0),
        ]
    )
    async with client(app(dash_store)) as c:
        body = (await c.get("/api/summary")).json()
        page = (await c.get("/")).text
    counts = dict(re.findall(r'id="lateness-bin-(\d+)" data-count="(\d+)"', page))
    assert counts == {
        "1": "3", "2": "0", "3": "0", "4": "2", "5": "0", "6": "0", "7": "0", "8": "0",
        "9": "0", "10": "2", "11": "1",
    }  # fmt: skip
    heights = dict(re.findall(r'id="lateness-bin-(\d+)" data-count="\d+" x="[\d.]+" y="[\d.]+"'
                              r' width="44" height="([\d.]+)"', page))  # fmt: skip
    assert float(heights["1"]) == 120.0 and float(heights["4"]) == 80.0
    assert float(heights["11"]) == 40.0 and float(heights["2"]) == 0.0
    assert 'id="lateness-ttl"' in page and "ttl = 1h 0m, 2h 0m" in page
    assert 'id="lateness-empty"' not in page and "DuplicateRecorder" in page
    assert "Fallback" not in page
    late = body["lateness"]
    assert late["source"] == "DuplicateRecorder" and late["duplicates"] == 8
    assert [b["count"] for b in late["bins"]] == [3, 0, 0, 2, 0, 0, 0, 0, 0, 2, 1]
    assert late["bins"][0] == {"bin": 1, "label": "< 1 s", "below_seconds": 1, "count": 3}
    assert late["ttl_seconds"] == {"billing": 3600.0, "shipping": 7200.0}
    assert body["duplicates"]["source"] == "DuplicateRecorder"
    last = body["duplicates"]["intervals"][-1]["scopes"]
    assert last["billing"] == {"claims": 12, "replays": 6, "rate": 0.5}
    assert last["shipping"] == {"claims": 2, "replays": 2, "rate": 1.0}
    assert "50.0%" in page  # billing's rate in the rate table


async def test_records_filters_and_keyset_pages(dash_store: Any) -> None:
    """Filters narrow the list; "next" pages through every record exactly once."""
    await seed(dash_store)
    async with client(app(dash_store, page_size=2)) as c:
        dead = (await c.get("/api/records", params={"state": "dead"})).json()
        assert [r["key"] for r in dead["records"]] == ["pay-dead-1", "pay-dead-2"]
        assert dead["next"] is None
        timeout = (await c.get("/api/records", params={"q": "timeout"})).json()
        assert [r["key"] for r in timeout["records"]] == ["pay-dead-2", "pay-failed"]
        prefixed = (await c.get("/api/records", params={"key": "ship-"})).json()
        assert [r["key"] for r in prefixed["records"]] == ["ship-0", "ship-1"]
        assert (await c.get("/api/records", params={"age": "1h"})).json()["records"] == []
        scoped = (await c.get("/api/records", params={"scope": "shipping"})).json()
        assert {r["scope"] for r in scoped["records"]} == {"shipping"}
        seen: list[str] = []
        after = ""
        while True:
            page = (await c.get("/api/records", params={"limit": 4, "after": after})).json()
            seen += [r["key"] for r in page["records"]]
            if page["next"] is None:
                break
            after = page["next"]
        assert len(seen) == 9 == len(set(seen))
        # the HTML list pages by its "next" link, filters kept
        html = (await c.get("/records", params={"scope": "billing"})).text
        hrefs: list[str] = []
        while True:
            hrefs += re.findall(r'class="key"><a href="([^"]+)"', html)
            m = re.search(r'<a href="([^"]+)" id="next"', html)
            if m is None:
                break
            link = m.group(1).replace("&amp;", "&")
            assert "scope=billing" in link
            html = (await c.get(link)).text
        assert len(hrefs) == 7
        for href in hrefs:
            assert (await c.get(href.replace("&amp;", "&"))).status_code == 200
        bad = await c.get("/api/records", params={"state": "nope"})
        assert bad.status_code == 400


async def test_record_page_and_json_every_field_escaped(dash_store: Any) -> None:
    """A key and error holding markup render as text; the JSON carries every field."""
    key = "<script>alert('k')</script>/%2F?&"
    await put(
        dash_store, "a/b c", key, State.DEAD, attempts=3,
        error='<img src=x onerror="alert(1)">', payload='{"x": "</pre><script>1</script>"}',
    )  # fmt: skip
    async with client(app(dash_store)) as c:
        listing = (await c.get("/records")).text
        href = re.findall(r'class="key"><a href="([^"]+)"', listing)[0]
        page = await c.get(href.replace("&amp;", "&"))
        body = (await c.get(f"/api/records/{q('a/b c')}/{q(key)}")).json()
    assert page.status_code == 200
    for html in (listing, page.text):
        assert "<script>" not in html and "<img" not in html
    assert "&lt;script&gt;alert(&#39;k&#39;)&lt;/script&gt;" in page.text
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert body["key"] == key and body["scope"] == "a/b c"
    assert set(body) >= {
        "scope", "key", "state", "attempts", "error", "payload", "result", "checkpoint",
        "token", "lease_until", "fingerprint", "created_at", "updated_at", "completed_at",
        "expires_at",
    }  # fmt: skip
    assert body["payload"] == '{"x": "</pre><script>1</script>"}'


async def test_writes_refused_without_a_configured_token(dash_store: Any) -> None:
    """Read-only by default: every write answers 403 and changes nothing."""
    await seed(dash_store)
    async with client(app(dash_store)) as c:
        url = "/api/records/billing/pay-dead-1/redrive"
        assert (await c.post(url)).status_code == 403
        assert (await c.post(url, headers=BEARER)).status_code == 403
        assert (await c.post("/records/billing/pay-dead-1/redrive")).status_code == 403
        assert (await c.post("/api/redrive", params={"state": "dead"})).status_code == 403
        assert (await c.post("/login", data={"token": ""})).status_code == 403
        page = (await c.get("/records/billing/pay-dead-1")).text
    assert 'id="redrive"' not in page and "Read-only" in page
    assert await state_of(dash_store, "billing", "pay-dead-1") is State.DEAD
    assert len(await onceonly.AsyncAdmin(dash_store).list_records(state=State.DEAD)) == 2


@pytest.mark.parametrize(
    ("method", "path", "params"),
    [
        ("post", "/api/records/billing/pay-dead-1/redrive", {}),
        ("post", "/api/records/billing/pay-dead-1/delete", {}),
        ("post", "/api/records/billing/pay-stuck/release", {}),
        ("post", "/api/redrive", {"state": "dead"}),
        ("post", "/api/outbox/redrive", {}),
        ("post", "/records/billing/pay-dead-1/redrive", {}),
        ("post", "/records/billing/pay-dead-1/delete", {}),
        ("post", "/redrive", {}),
        ("post", "/outbox", {}),
    ],
)
async def test_refused_writes_answer_401_or_403_and_change_nothing(
    dash_store: Any, method: str, path: str, params: dict[str, str]
) -> None:
    """No credential: 401; a wrong token, a forged cookie, or no CSRF field: 403."""
    await seed(dash_store)
    form = {"confirm": "yes", "state": "dead", "scope": "billing"}
    admin = onceonly.AsyncAdmin(dash_store)
    before = await admin.list_records(limit=100)
    async with client(app(dash_store, token=TOKEN)) as c:
        none = await c.request(method, path, params=params, data=form)
        assert none.status_code == 401 and "Bearer" in none.headers["www-authenticate"]
        wrong = await c.request(
            method, path, params=params, data=form, headers={"authorization": "Bearer nope"}
        )
        assert wrong.status_code == 403
        basic = await c.request(
            method, path, params=params, data=form, headers={"authorization": f"Basic {TOKEN}"}
        )
        assert basic.status_code == 403
        c.cookies.set("onceonly_dashboard", "1.forged.deadbeef")
        assert (await c.request(method, path, params=params, data=form)).status_code == 403
        # a real session without the form's CSRF field
        c.cookies.clear()
        login = await c.post("/login", data={"token": TOKEN})
        assert login.status_code == 303
        assert (await c.request(method, path, params=params, data=form)).status_code == 403
        bad_csrf = {**form, "csrf": "0" * 64}
        assert (await c.request(method, path, params=params, data=bad_csrf)).status_code == 403
    assert await admin.list_records(limit=100) == before


async def test_login_sets_a_strict_httponly_cookie_and_forms_carry_csrf(dash_store: Any) -> None:
    """Login with the token; the record page's forms redrive with the CSRF field."""
    await seed(dash_store)
    async with client(app(dash_store, token=TOKEN)) as c:
        wrong = await c.post("/login", data={"token": "guess"})
        assert wrong.status_code == 403 and "set-cookie" not in wrong.headers
        for evil in ("//evil.example/", "/\t/evil.example/", "/\\evil.example", "https://e.x/"):
            ok = await c.post("/login", data={"token": TOKEN, "next": evil})
            assert ok.status_code == 303 and ok.headers["location"].startswith("/?done=login&")
        ok = await c.post("/login", data={"token": TOKEN, "next": "/records?state=dead"})
        assert ok.headers["location"] == "/records?state=dead"
        cookie = ok.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
        assert TOKEN.lower() not in cookie
        page = (await c.get("/records/billing/pay-dead-1")).text
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
        assert csrf is not None
        done = await c.post("/records/billing/pay-dead-1/redrive", data={"csrf": csrf.group(1)})
        assert done.status_code == 303 and "done=redrive" in done.headers["location"]
        assert await state_of(dash_store, "billing", "pay-dead-1") is State.FAILED
        # delete needs its confirmation box
        no_box = await c.post("/records/billing/pay-0/delete", data={"csrf": csrf.group(1)})
        assert no_box.status_code == 400
        assert await state_of(dash_store, "billing", "pay-0") is State.COMPLETED
        gone = await c.post(
            "/records/billing/pay-0/delete", data={"csrf": csrf.group(1), "confirm": "yes"}
        )
        assert gone.status_code == 303
        assert await state_of(dash_store, "billing", "pay-0") is None
        await c.post("/logout", data={"csrf": csrf.group(1)})
        assert (await c.post("/records/billing/pay-dead-2/redrive")).status_code == 401


async def test_bearer_actions_are_the_fenced_admin_operations(dash_store: Any) -> None:
    """Redrive, release and delete through the API; one that does not apply is a 409."""
    await seed(dash_store)
    async with client(app(dash_store, token=TOKEN)) as c:
        r = await c.post("/api/records/billing/pay-dead-1/redrive", headers=BEARER)
        assert r.status_code == 200 and r.json()["record"]["state"] == "failed"
        assert r.json()["record"]["attempts"] == 0
        again = await c.post("/api/records/billing/pay-0/redrive", headers=BEARER)
        assert again.status_code == 409 and again.json()["done"] is False
        rel = await c.post("/api/records/billing/pay-stuck/release", headers=BEARER)
        assert rel.status_code == 200 and rel.json()["record"]["state"] == "failed"
        live = await c.post("/api/records/billing/pay-0/release", headers=BEARER)
        assert live.status_code == 409
        gone = await c.post("/api/records/shipping/ship-0/delete", headers=BEARER)
        assert gone.status_code == 200 and gone.json()["record"] is None
        absent = await c.get("/api/records/shipping/ship-0")
        assert absent.status_code == 404


async def test_filtered_redrive_counts_first_then_confirms(dash_store: Any) -> None:
    """The confirmation page's dry run changes nothing; confirming redrives the set."""
    await seed(dash_store)
    admin = onceonly.AsyncAdmin(dash_store)
    async with client(app(dash_store, token=TOKEN)) as c:
        dry = await c.post(
            "/api/redrive", params={"state": "dead", "q": "timeout", "dry_run": "1"}, headers=BEARER
        )
        assert dry.json()["dry_run"] is True and dry.json()["matched"] == 1
        await c.post("/login", data={"token": TOKEN})
        page = (await c.get("/redrive", params={"state": "dead", "scope": "billing"})).text
        assert 'id="match-count">2<' in page
        assert len(await admin.list_records(state=State.DEAD)) == 2
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
        assert csrf is not None
        before = re.search(r'name="before" value="([^"]+)"', page)
        assert before is not None
        form = {
            "csrf": csrf.group(1), "state": "dead", "scope": "billing",
            "before": before.group(1), "count": "2",
        }  # fmt: skip
        assert (await c.post("/redrive", data=form)).status_code == 400  # not confirmed
        assert len(await admin.list_records(state=State.DEAD)) == 2
        done = await c.post("/redrive", data={**form, "confirm": "yes"})
        assert done.status_code == 303 and "n=2" in done.headers["location"]
    assert await admin.list_records(state=State.DEAD) == []


async def test_redriven_record_runs_on_the_next_delivery(dash_store: Any) -> None:
    """A message that went dead runs its handler again after a redrive."""
    inbox = onceonly.AsyncInbox(dash_store, consumer="billing", max_attempts=1)
    runs: list[str] = []
    broken = [True]

    async def handler(msg: Any, tx: Any) -> str:
        runs.append(msg["id"])
        if broken[0]:
            raise RuntimeError("card declined")
        return "charged"

    with pytest.raises(RuntimeError):
        await inbox.process("m-1", {"id": "m-1"}, handler)
    assert await state_of(dash_store, "billing", "m-1") is State.DEAD
    broken[0] = False  # the operator fixed the cause
    with pytest.raises(onceonly.DeadLettered):
        await inbox.process("m-1", {"id": "m-1"}, handler)
    assert runs == ["m-1"]
    async with client(app(dash_store, token=TOKEN)) as c:
        body = (await c.get("/api/records/billing/m-1")).json()
        assert "card declined" in body["error"]
        r = await c.post("/api/records/billing/m-1/redrive", headers=BEARER)
        assert r.status_code == 200
    outcome = await inbox.process("m-1", {"id": "m-1"}, handler)
    assert outcome.result == "charged" and runs == ["m-1", "m-1"]
    assert await state_of(dash_store, "billing", "m-1") is State.COMPLETED


async def test_outbox_dead_rows_redrive(dash_store: Any) -> None:
    """Dead outbox rows are listed and redriven to pending."""
    from onceonly.outbox import AsyncOutbox

    outbox = AsyncOutbox(dash_store)
    async with dash_store.transaction() as s:
        await outbox.write(s, outbox.prepare("receipts", {"id": 1}))
    async with dash_store.transaction() as s:
        await s.execute(f"UPDATE {outbox.sql.table} SET state = 'dead', last_error = '<b>x</b>'")
    async with client(app(dash_store, token=TOKEN)) as c:
        listed = (await c.get("/api/outbox")).json()
        assert listed["dead"] == 1 and listed["rows"][0]["last_error"] == "<b>x</b>"
        page = (await c.get("/outbox")).text
        assert "&lt;b&gt;x&lt;/b&gt;" in page
        one = listed["rows"][0]["id"]
        r = await c.post(f"/api/outbox/{one}/redrive", headers=BEARER)
        assert r.json() == {"redriven": 1}
        assert (await c.get("/api/summary")).json()["outbox"]["pending"] == 1


async def test_mounted_under_fastapi_at_a_sub_path(dash_store: Any) -> None:
    """Mounted at /ops: every link, redirect and cookie path stays under /ops."""
    await seed(dash_store)
    outer = FastAPI()
    outer.mount("/ops", app(dash_store, token=TOKEN))

    @outer.get("/")
    async def home() -> dict[str, str]:
        return {"app": "mine"}

    async with client(outer) as c:
        assert (await c.get("/")).json() == {"app": "mine"}
        overview = (await c.get("/ops/")).text
        links = re.findall(r'(?:href|action)="([^"]+)"', overview)
        assert links and all(link.startswith("/ops/") for link in links)
        records = (await c.get("/ops/records", params={"state": "dead"})).text
        href = re.findall(r'class="key"><a href="([^"]+)"', records)[0]
        assert href == "/ops/records/billing/pay-dead-1"
        assert "CardDeclined" in (await c.get(href)).text
        assert (await c.get("/ops/api/records/billing/pay-dead-1")).json()["state"] == "dead"
        login = await c.post("/ops/login", data={"token": TOKEN})
        assert login.headers["location"].startswith("/ops/")
        assert "path=/ops/" in login.headers["set-cookie"].lower()
        css = await c.get("/ops/static/dashboard.css")
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")


async def test_no_connection_string_or_token_in_any_page(dash_store: Any) -> None:
    """Nothing the pages or the API show holds the store's URL or the token."""
    await seed(dash_store)
    async with client(app(dash_store, token=TOKEN)) as c:
        await c.post("/login", data={"token": TOKEN})
        bodies = [
            (await c.get(p)).text
            for p in ("/", "/records", "/records/billing/pay-dead-1", "/outbox", "/login",
                      "/api/summary", "/api/records", "/redrive?state=dead")
        ]  # fmt: skip
    for body in bodies:
        assert TOKEN not in body
        assert "postgresql://" not in body and "sqlite:" not in body and "127.0.0.1" not in body
