# SPDX-License-Identifier: MIT
"""A claim whose reply is lost is not an attempt (docs/spec.md §2.3.1).

A TCP proxy between the store and the client lets the next request through, loses its
reply and then resets the connection: the claim commits on the server, the client only
sees the connection drop. With ``max_attempts=1`` the key's function must still run,
exactly once, and the key must never end dead without having run: the caller asks again
under the same token (in the same call, or, when the store stays away longer than the
call's budget, in its next call) and the store's record is recognised as its own claim.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import onceonly
from onceonly.errors import DeadLettered, InFlight, StoreUnavailable
from tests.conftest import (
    MYSQL_URL,
    PG_URL,
    REDIS_URL,
    drop_mysql_table,
    drop_pg_table,
    drop_redis_prefix,
    require_mysql,
    require_postgres,
    require_redis,
    unique_table,
)
from tests.e2e._proxy import TcpProxy

pytestmark = pytest.mark.timeout(120)


def _closed_port() -> int:
    """A local port nothing listens on (connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _via(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    scheme, rest = url.split("://", 1)
    userinfo, _, hostpath = rest.rpartition("@")
    path = hostpath.split("/", 1)[1] if "/" in hostpath else ""
    at = f"{userinfo}@" if userinfo else ""
    return f"{scheme}://{at}127.0.0.1:{port}/{path}"


def _upstream(url: str) -> tuple[str, int]:
    hostpath = url.split("://", 1)[1].rpartition("@")[2].split("/", 1)[0]
    host, _, port = hostpath.partition(":")
    return host, int(port)


@pytest.fixture(params=["postgres", "redis", "mysql"])
def proxied(request: pytest.FixtureRequest) -> Iterator[tuple[TcpProxy, Any]]:
    """A store of the parameter's kind, reached through a proxy the test cuts."""
    kind = request.param
    url = {"postgres": PG_URL, "redis": REDIS_URL, "mysql": MYSQL_URL}[kind]
    {"postgres": require_postgres, "redis": require_redis, "mysql": require_mysql}[kind]()
    proxy = TcpProxy(*_upstream(url)).start()
    table = unique_table()
    options: dict[str, Any] = (
        {"prefix": f"{table}:"} if kind == "redis" else {"table": table, "migrate": True}
    )
    if kind == "postgres":
        options.update(connect_timeout=1.0, timeout=1.0)  # a checkout in the outage fails fast
    store = onceonly.open_store(_via(url, proxy.port), **options)
    try:
        yield proxy, store
    finally:
        proxy.upstream = _upstream(url)
        store.close()
        proxy.close()
        if kind == "postgres":
            drop_pg_table(table)
        elif kind == "mysql":
            drop_mysql_table(table)
        else:
            drop_redis_prefix(f"{table}:")


def _settle(call: Any, *, within: float) -> Any:
    """Call until it returns (InFlight and StoreUnavailable are retried, as a caller
    does); DeadLettered fails the test at once."""
    deadline = time.monotonic() + within
    while True:
        try:
            return call()
        except (InFlight, StoreUnavailable):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.parametrize("outage", ["blip", "longer than the call"])
def test_a_claim_whose_reply_was_lost_runs_once_and_is_not_counted(
    proxied: tuple[TcpProxy, Any], outage: str
) -> None:
    """max_attempts=1: the reply of the committed claim is lost; the function still runs once."""
    proxy, store = proxied
    runs: list[str] = []

    @onceonly.idempotent(
        store, key=lambda k: k, lease=1.0, max_attempts=1, wait=0.2, scope="charge"
    )
    def charge(k: str) -> str:
        runs.append(k)
        return f"charged {k}"

    assert charge("warm") == "charged warm"  # the pool's connection is open now
    key = f"k-{uuid.uuid4().hex[:8]}"
    upstream = proxy.upstream
    proxy.arm("replies", blackout=0.1)
    if outage != "blip":
        # reconnecting fails for a while: the call gives up, the next call recovers
        proxy.upstream = ("127.0.0.1", _closed_port())
    first: BaseException | None = None
    try:
        charge(key)
    except StoreUnavailable as exc:
        first = exc
    assert proxy.dropped >= 1, "the proxy did not cut the claim's connection"
    if outage != "blip":
        assert first is not None, "the store was away longer than the call's budget"
    proxy.upstream = upstream
    try:
        result = _settle(lambda: charge(key), within=10.0)
    except DeadLettered as exc:  # pragma: no cover - the failure this test guards
        pytest.fail(f"the key is dead although its function ran {runs.count(key)} times: {exc}")
    assert result == f"charged {key}"
    assert runs.count(key) == 1
    # and the record says one attempt, the one that ran
    assert charge(key) == f"charged {key}"
    assert runs.count(key) == 1
