# SPDX-License-Identifier: MIT
"""onceonly.contrib.django under a real WSGI server (waitress), on SQLite and PostgreSQL:
the migration creates the table, the middleware replays, atomic views commit their ORM
writes with the stored response."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import PG_URL, drop_pg_table, require_postgres, unique_table
from tests.http.servers import Server, serve

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    effects = tmp_path / "effects"
    effects.touch()
    table = unique_table()
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'dj.db'}"
        yield {"ONCEONLY_URL": url, "ONCEONLY_TABLE": table, "EFFECTS": str(effects)}
        return
    require_postgres()
    import psycopg

    schema = f"dj_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    yield {
        "ONCEONLY_URL": PG_URL,
        "ONCEONLY_TABLE": table,
        "EFFECTS": str(effects),
        "DJANGO_SCHEMA": schema,
    }
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
    drop_pg_table(table)
    drop_pg_table(f"{table}_outbox")


def runs(env: dict[str, str]) -> int:
    return len(Path(env["EFFECTS"]).read_text().splitlines())


def hdrs(key: str = "k1", user: str = "alice", sleep: float = 0) -> dict[str, str]:
    return {"Idempotency-Key": key, "X-User": user, "X-Sleep": str(sleep)}


def test_django_leased(env: dict[str, str]) -> None:
    """Replay with status, Location and the marker (no cookie); 400, 422, principals."""
    with serve("django", env) as s, httpx.Client(base_url=s.url) as c:
        first = c.post("/orders", json={"item": "a"}, headers=hdrs())
        again = c.post("/orders", json={"item": "a"}, headers=hdrs())
        assert first.status_code == again.status_code == 201
        assert first.json() == again.json() == {"order": 1, "item": "a"}
        assert again.headers["location"] == "/orders/1"
        assert again.headers["idempotent-replayed"] == "true"
        assert "set-cookie" in first.headers and "set-cookie" not in again.headers
        assert c.post("/orders", json={}, headers={"X-User": "a"}).status_code == 400
        r = c.post("/orders", json={"item": "b"}, headers=hdrs())
        assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
        assert c.post("/orders", json={"item": "a"}, headers=hdrs(user="bob")).json()["order"] == 2
    assert runs(env) == 2


def orders(env: dict[str, str], s: Server) -> int:
    """Rows of the atomic view's table, read through a keyless request-free query."""
    import onceonly

    table = env["ONCEONLY_TABLE"]
    schema = env.get("DJANGO_SCHEMA")
    name = f"{schema}.{table}_orders" if schema else f"{table}_orders"
    store = onceonly.open_store(env["ONCEONLY_URL"], table=table)
    with store.transaction() as session:
        n = int(session.execute(f"SELECT count(*) FROM {name}").fetchone()[0])
    store.close()
    return n


def test_django_atomic(env: dict[str, str]) -> None:
    """An atomic view's row commits with its response; a 500 rolls it back; SIGKILL
    mid-request commits nothing and the retry runs at once."""
    first = Server("django", env)
    try:
        with pytest.raises(httpx.TransportError):
            httpx.post(first.url + "/atomic", json={"item": "k"}, headers=hdrs("kill", sleep=30),
                       timeout=1.5)  # fmt: skip
        first.kill()
    finally:
        first.stop()
    with serve("django", env) as s, httpx.Client(base_url=s.url, timeout=30) as c:
        assert orders(env, s) == 0
        r = c.post("/atomic", json={"item": "k"}, headers=hdrs("kill"))
        assert r.status_code == 201 and "idempotent-replayed" not in r.headers
        again = c.post("/atomic", json={"item": "k"}, headers=hdrs("kill"))
        assert again.headers["idempotent-replayed"] == "true" and orders(env, s) == 1
        failed = c.post("/atomic", json={"item": "x", "status": 500}, headers=hdrs("k5"))
        assert failed.status_code == 500 and orders(env, s) == 1
    assert runs(env) == 3


def test_django_http404_rolls_back(env: dict[str, str]) -> None:
    """An atomic view that writes, then raises Http404, commits nothing and its 404 is
    replayed (issue 19 D)."""
    with serve("django", env) as s, httpx.Client(base_url=s.url, timeout=30) as c:
        body = {"item": "gone", "http404": True}
        first = c.post("/atomic", json=body, headers=hdrs("nf"))
        again = c.post("/atomic", json=body, headers=hdrs("nf"))
        assert first.status_code == again.status_code == 404
        assert again.headers["idempotent-replayed"] == "true"
        assert orders(env, s) == 0
    assert runs(env) == 1


@pytest.mark.parametrize("server", ["django", "django-asgi"])
def test_django_async_view(env: dict[str, str], server: str) -> None:
    """An async view behind the middleware runs once and is replayed, under a WSGI
    (waitress) and an ASGI (uvicorn) server (issue 19 I)."""
    with serve(server, env) as s, httpx.Client(base_url=s.url, timeout=30) as c:
        a1 = c.post("/async", json={"item": "a"}, headers=hdrs("as"))
        a2 = c.post("/async", json={"item": "a"}, headers=hdrs("as"))
        assert a1.status_code == a2.status_code == 201
        assert a1.json() == a2.json() and a2.headers["idempotent-replayed"] == "true"
    assert runs(env) == 1
