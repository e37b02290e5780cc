# SPDX-License-Identifier: MIT
"""Real servers, real clients: uvicorn (ASGI, FastAPI) and waitress (WSGI, Flask) run as
processes on SQLite and PostgreSQL; httpx sends the requests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import PG_URL, drop_pg_table, require_postgres, unique_table
from tests.http.servers import Server, serve

pytestmark = pytest.mark.slow

SERVERS = ["uvicorn", "waitress"]


@pytest.fixture(params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    effects = tmp_path / "effects"
    effects.touch()
    if request.param == "postgres":
        require_postgres()
        table = unique_table()
        yield {"ONCEONLY_URL": PG_URL, "ONCEONLY_TABLE": table, "EFFECTS": str(effects)}
        for t in (table, f"{table}_outbox", f"{table}_orders"):
            drop_pg_table(t)
    else:
        url = f"sqlite:///{tmp_path / 'o.db'}"
        yield {"ONCEONLY_URL": url, "EFFECTS": str(effects)}


def runs(env: dict[str, str]) -> int:
    return len(Path(env["EFFECTS"]).read_text().splitlines())


def hdrs(key: str = "k1", user: str = "alice", sleep: float = 0) -> dict[str, str]:
    """Headers of a request; X-Sleep (not in the fingerprint) makes the handler slow."""
    return {"Idempotency-Key": key, "X-User": user, "X-Sleep": str(sleep)}


@pytest.mark.parametrize("server", SERVERS)
def test_replay_and_errors(server: str, env: dict[str, str]) -> None:
    """201 + Location replayed with the marker; 400, 422, principal isolation, a key
    too long, a body over the limit."""
    with serve(server, env) as s, httpx.Client(base_url=s.url) as c:
        first = c.post("/orders", json={"item": "a"}, headers=hdrs())
        again = c.post("/orders", json={"item": "a"}, headers=hdrs())
        assert first.status_code == again.status_code == 201
        assert first.json() == again.json() == {"order": 1, "item": "a"}
        assert again.headers["location"] == "/orders/1"
        assert again.headers["idempotent-replayed"] == "true"
        assert c.post("/orders", json={}, headers={"X-User": "a"}).status_code == 400
        r = c.post("/orders", json={"item": "b"}, headers=hdrs())
        assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
        bob = c.post("/orders", json={"item": "a"}, headers=hdrs(user="bob"))
        assert bob.json() == {"order": 2, "item": "a"}
        bad = c.post("/orders", json={}, headers={**hdrs(), "Idempotency-Key": "x" * 300})
        assert bad.status_code == 400 and bad.json()["type"].endswith("#invalid-key")
        big = c.post("/orders", content=b"[" + b" " * (1 << 20) + b"]", headers=hdrs("big"))
        assert big.status_code == 413 and big.json()["type"].endswith("#request-too-large")
    assert runs(env) == 2


@pytest.mark.parametrize("server", SERVERS)
def test_16_concurrent_requests_run_once(server: str, env: dict[str, str]) -> None:
    """16 requests with one key at once: one run; each gets that response or a 409."""

    async def burst(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            return await asyncio.gather(
                *(c.post("/orders", json={}, headers=hdrs(sleep=0.5)) for _ in range(16))
            )

    with serve(server, env) as s:
        answers = asyncio.run(burst(s.url))
        statuses = sorted(r.status_code for r in answers)
        assert set(statuses) <= {201, 409} and 201 in statuses
        assert all(r.json() == {"order": 1, "item": None} for r in answers if r.status_code == 201)
        assert all("retry-after" in r.headers for r in answers if r.status_code == 409)
        time.sleep(0.6)
        replay = httpx.post(s.url + "/orders", json={}, headers=hdrs(sleep=0.5))
        assert replay.headers["idempotent-replayed"] == "true"
    assert runs(env) == 1


@pytest.mark.parametrize("server", SERVERS)
def test_client_disconnect_still_stores(server: str, env: dict[str, str]) -> None:
    """A client that hangs up during the handler: the response is stored; the retry replays."""
    with serve(server, env) as s:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(s.url + "/orders", json={}, headers=hdrs(sleep=1.0), timeout=0.3)
        deadline = time.monotonic() + 10
        while True:
            r = httpx.post(s.url + "/orders", json={}, headers=hdrs(sleep=1.0))
            if r.status_code != 409 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.status_code == 201 and r.headers["idempotent-replayed"] == "true"
        assert r.json() == {"order": 1, "item": None}
    assert runs(env) == 1


@pytest.mark.parametrize("server", SERVERS)
def test_server_killed_mid_request_retry_runs(server: str, env: dict[str, str]) -> None:
    """SIGKILL during the handler: retries get 409 while the lease lives, then one runs it."""
    lease = 3.0
    env = {**env, "LEASE": str(lease)}
    first = Server(server, env)
    began = time.monotonic()
    try:
        with pytest.raises(httpx.TransportError):
            httpx.post(first.url + "/orders", json={}, headers=hdrs(sleep=30), timeout=0.5)
        first.kill()
    finally:
        first.stop()
    assert runs(env) == 1
    with serve(server, env) as s:
        while True:
            r = httpx.post(s.url + "/orders", json={}, headers=hdrs())
            if r.status_code != 409:
                break
            assert int(r.headers["retry-after"]) >= 1
            time.sleep(0.25)
        assert r.status_code == 201 and "idempotent-replayed" not in r.headers
        assert time.monotonic() - began >= lease  # not before the dead server's lease lapsed
        r = httpx.post(s.url + "/orders", json={}, headers=hdrs())
        assert r.headers["idempotent-replayed"] == "true"
    assert runs(env) == 2


def orders(env: dict[str, str]) -> int:
    import onceonly

    table = env.get("ONCEONLY_TABLE")
    store = onceonly.open_store(env["ONCEONLY_URL"], **({"table": table} if table else {}))
    with store.transaction() as s:
        n = int(s.execute(f"SELECT count(*) FROM {table or 't'}_orders").fetchone()[0])
    store.close()
    return n


@pytest.mark.parametrize("server", SERVERS)
def test_atomic_server_killed_mid_request_commits_nothing(server: str, env: dict[str, str]) -> None:
    """Atomic mode: SIGKILL in the handler commits nothing; the retry runs at once, once."""
    first = Server(server, env)
    try:
        with pytest.raises(httpx.TransportError):
            httpx.post(first.url + "/atomic", json={"item": "a"}, headers=hdrs(sleep=30),
                       timeout=1.0)  # fmt: skip
        first.kill()
    finally:
        first.stop()
    assert runs(env) == 1 and orders(env) == 0
    with serve(server, env) as s:
        r = httpx.post(s.url + "/atomic", json={"item": "a"}, headers=hdrs(), timeout=30)
        assert r.status_code == 201 and "idempotent-replayed" not in r.headers
        r = httpx.post(s.url + "/atomic", json={"item": "a"}, headers=hdrs())
        assert r.status_code == 201 and r.headers["idempotent-replayed"] == "true"
    assert runs(env) == 2 and orders(env) == 1
