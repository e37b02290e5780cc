# SPDX-License-Identifier: MIT
"""The HTTP flow under a real ASGI server (uvicorn) and real clients (httpx): background
tasks, a non-stored 5xx, a stalled holder that lost its lease (issue 19 C, F, G)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import onceonly
from onceonly._core import http as core
from onceonly._core.state import State
from tests.conftest import PG_URL, drop_pg_table, require_postgres, unique_table
from tests.http.servers import Server, serve

pytestmark = pytest.mark.slow


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
        yield {"ONCEONLY_URL": f"sqlite:///{tmp_path / 'o.db'}", "EFFECTS": str(effects)}


def runs(env: dict[str, str]) -> int:
    return len(Path(env["EFFECTS"]).read_text().splitlines())


def claim_state(env: dict[str, str], key: str) -> State | None:
    """The state of ``key``'s record for the principal ``alice``, read from the store."""
    table = {"table": env["ONCEONLY_TABLE"]} if "ONCEONLY_TABLE" in env else {}
    store = onceonly.open_store(env["ONCEONLY_URL"], **table)
    try:
        with store.session() as session:
            record = session.get(core.scope_of("alice"), key).record
    except onceonly.StoreError:
        return None  # not migrated yet: nothing claimed
    finally:
        store.close()
    return None if record is None else record.state


def wait_until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll ``check`` until it holds (or fail after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the awaited state never came"
        time.sleep(0.02)


def hdrs(key: str, **extra: str) -> dict[str, str]:
    return {"Idempotency-Key": key, "X-User": "alice", **extra}


def test_background_tasks_run_after_the_stored_response(env: dict[str, str]) -> None:
    """A 3 s background task does not delay the keyed response; a failing one does not
    turn it into a 500 nor release the key (the retry replays, never runs again)."""
    with serve("uvicorn", env) as s, httpx.Client(base_url=s.url, timeout=30) as c:
        started = time.monotonic()
        r = c.post("/background", json={}, headers=hdrs("slow", **{"X-Bg-Sleep": "3"}))
        took = time.monotonic() - started
        assert r.status_code == 202 and took < 1.5, took
        again = c.post("/background", json={}, headers=hdrs("slow"))
        assert again.status_code == 202 and again.headers["idempotent-replayed"] == "true"
        assert again.json() == r.json()

        failing = c.post("/background", json={}, headers=hdrs("fail", **{"X-Bg-Fail": "1"}))
        assert failing.status_code == 202
        # uvicorn closes the connection after the app raised: a new one for the retry
        retry = httpx.post(s.url + "/background", json={}, headers=hdrs("fail"))
        assert retry.status_code == 202 and retry.headers["idempotent-replayed"] == "true"
        assert retry.json() == failing.json()
    assert runs(env) == 2


def test_atomic_commits_before_background_tasks(env: dict[str, str]) -> None:
    """Atomic mode: the transaction commits when the response is sent, before a 3 s
    background task: the client is answered at once and another key is not held up."""
    with serve("uvicorn", env) as s, httpx.Client(base_url=s.url, timeout=30) as c:
        started = time.monotonic()
        r = c.post(
            "/atomic-background", json={"item": "a"}, headers=hdrs("a1", **{"X-Bg-Sleep": "3"})
        )
        assert r.status_code == 201 and time.monotonic() - started < 1.5
        other = c.post("/atomic", json={"item": "b"}, headers=hdrs("a2"))
        assert other.status_code == 201 and time.monotonic() - started < 2.0
        replay = c.post("/atomic-background", json={"item": "a"}, headers=hdrs("a1"))
        assert replay.headers["idempotent-replayed"] == "true"
    assert Path(env["EFFECTS"] + ".bg").read_text() == "a committed\n"


def test_unstored_5xx_releases_before_it_is_sent(env: dict[str, str]) -> None:
    """A 503 is not stored and the key is given back before the client sees it: an
    immediate retry runs again (was 409 until the app returned)."""
    with serve("uvicorn", env) as s, httpx.Client(base_url=s.url, timeout=30) as c:
        first = c.post("/fail", json={}, headers=hdrs("k5", **{"X-Bg-Sleep": "2"}))
        retry = c.post("/fail", json={}, headers=hdrs("k5", **{"X-Bg-Sleep": "2"}))
        assert first.status_code == retry.status_code == 503
        assert retry.json() == {"run": 2}


def test_stalled_holder_never_sends_a_second_success_body(env: dict[str, str]) -> None:
    """A holder stopped past its lease (SIGSTOP) while a duplicate on another server takes
    the key over and stores its response: on resume it sends the winner's response (or
    409), never its own different 201."""
    env = {**env, "LEASE": "1"}
    a, b = Server("uvicorn", env), Server("uvicorn", env)
    answers: list[httpx.Response] = []
    try:

        def stalled() -> None:
            answers.append(
                httpx.post(
                    a.url + "/orders",
                    json={"item": "x"},
                    timeout=30,
                    headers=hdrs("lost", **{"X-Sleep": "2"}),
                )
            )

        thread = threading.Thread(target=stalled)
        thread.start()
        # A's claim is in the store and its handler has started (it writes its effect
        # first, then sleeps 2 s): only then is A stopped, however slow the machine
        wait_until(lambda: claim_state(env, "lost") is State.IN_PROGRESS and runs(env) == 1)
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            # B answers 409 while A's lease is live; once it lapses, B takes the key over
            winner = httpx.Response(409)
            deadline = time.monotonic() + 20
            while winner.status_code == 409 and time.monotonic() < deadline:
                time.sleep(0.1)
                winner = httpx.post(
                    b.url + "/orders", json={"item": "x"}, headers=hdrs("lost"), timeout=30
                )
            assert winner.status_code == 201, winner.text
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        thread.join(30)
        (mine,) = answers
        assert runs(env) == 2  # both ran the handler: A's lease was taken over
        assert mine.status_code == 409 or mine.json() == winner.json(), mine.text
    finally:
        a.stop()
        b.stop()


@pytest.mark.parametrize("server", ["uvicorn", "waitress"])
def test_sqlite_atomic_keys_wait_for_the_write_lock(server: str, tmp_path: Path) -> None:
    """SQLite atomic routes: four concurrent requests with different keys all succeed; the
    database write lock they queue on is never reported as a key in flight (409)."""
    effects = tmp_path / "effects"
    effects.touch()
    env = {"ONCEONLY_URL": f"sqlite:///{tmp_path / 'o.db'}", "EFFECTS": str(effects)}
    with serve(server, env) as s:

        def post(key: str) -> httpx.Response:
            return httpx.post(
                s.url + "/atomic", json={"item": key}, headers=hdrs(key, **{"X-Sleep": "0.4"}),
                timeout=30,
            )  # fmt: skip

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(post, ["a", "b", "c", "d"]))
    assert [r.status_code for r in answers] == [201] * 4, [r.text for r in answers]
    assert runs(env) == 4
