# SPDX-License-Identifier: MIT
"""The pure HTTP decisions of onceonly._core.http."""

from __future__ import annotations

import pytest

from onceonly._core import http as core
from onceonly._core.state import Record, State
from onceonly.errors import ConfigurationError, CorruptRecord

POLICY = core.HttpPolicy()
REQ = core.RouteRule(core.Requirement.REQUIRED)
OPT = core.RouteRule()


def test_plan_passes_other_methods_and_off_routes() -> None:
    """GET, and any route marked off, pass through even with a key."""
    h = {"idempotency-key": "k"}
    assert isinstance(core.plan("GET", "/", h, "u", REQ, POLICY), core.Pass)
    off = core.RouteRule(core.Requirement.OFF)
    assert isinstance(core.plan("POST", "/", h, "u", off, POLICY), core.Pass)


def test_plan_missing_key() -> None:
    """Required: 400 missing-key; optional: pass through."""
    p = core.plan("POST", "/", {}, "u", REQ, POLICY)
    assert isinstance(p, core.Problem) and p.status == 400 and p.name == "missing-key"
    assert isinstance(core.plan("POST", "/", {}, "u", OPT, POLICY), core.Pass)


def test_plan_scopes_by_method_route_and_principal() -> None:
    """The scope differs per principal, route and method, and holds no raw principal."""
    h = {"idempotency-key": '"abc"'}
    a = core.plan("POST", "/o", h, "secret-api-key", REQ, POLICY)
    assert isinstance(a, core.Proceed) and a.key == "abc"
    assert "secret-api-key" not in a.scope and a.scope.startswith("http:POST:/o:")
    others = [
        core.plan("POST", "/o", h, "other", REQ, POLICY),
        core.plan("PATCH", "/o", h, "secret-api-key", REQ, POLICY),
        core.plan("POST", "/p", h, "secret-api-key", REQ, POLICY),
    ]
    assert all(isinstance(o, core.Proceed) and o.scope != a.scope for o in others)
    long = core.plan("POST", "/" + "x" * 300, h, "u", REQ, POLICY)
    assert isinstance(long, core.Proceed) and len(long.scope) <= 255


def test_plan_no_principal() -> None:
    """No principal: 403 by default, pass with anonymous='pass'."""
    h = {"idempotency-key": "k"}
    p = core.plan("POST", "/", h, None, REQ, POLICY)
    assert isinstance(p, core.Problem) and p.status == 403
    lax = core.HttpPolicy(anonymous="pass")
    assert isinstance(core.plan("POST", "/", h, None, REQ, lax), core.Pass)


def test_fingerprint_covers_method_route_body_and_chosen_headers() -> None:
    """Each part changes the fingerprint; unchosen headers do not."""
    base = core.request_fingerprint("POST", "/o", b"{}", {"x-a": "1"}, ["x-a"])
    assert base.startswith("h1:")
    assert base == core.request_fingerprint("POST", "/o", b"{}", {"x-a": "1", "x-b": "2"}, ["x-a"])
    for other in [
        core.request_fingerprint("PATCH", "/o", b"{}", {"x-a": "1"}, ["x-a"]),
        core.request_fingerprint("POST", "/p", b"{}", {"x-a": "1"}, ["x-a"]),
        core.request_fingerprint("POST", "/o", b"{ }", {"x-a": "1"}, ["x-a"]),
        core.request_fingerprint("POST", "/o", b"{}", {"x-a": "2"}, ["x-a"]),
    ]:
        assert other != base


@pytest.mark.parametrize(
    ("status", "stored"),
    [(200, True), (201, True), (204, True), (303, True), (400, True), (404, True),
     (422, True), (401, False), (409, False), (429, False), (500, False), (503, False)],
)  # fmt: skip
def test_should_store(status: int, stored: bool) -> None:
    """2xx, 3xx and deterministic 4xx are stored; 5xx, 429 and transient 4xx are not."""
    headers = {} if status == 204 else {"content-length": "2"}
    assert core.should_store(status, headers, POLICY)[0] is stored


def test_should_store_server_errors_opt_in_never_429() -> None:
    """store_server_errors stores 5xx, never 429."""
    p = core.HttpPolicy(store_server_errors=True)
    assert core.should_store(500, {"content-length": "1"}, p)[0]
    assert not core.should_store(429, {"content-length": "1"}, p)[0]


def test_streams_and_big_bodies_warn() -> None:
    """No Content-Length or over the limit: not stored, with a warning reason."""
    ok, why = core.should_store(200, {}, POLICY)
    assert not ok and why and why.startswith("!")
    ok, why = core.should_store(200, {"content-length": str(core.MIB + 1)}, POLICY)
    assert not ok and why and why.startswith("!")


def test_response_round_trip_and_replay_headers() -> None:
    """Text and binary bodies survive; replays add Content-Length and the marker."""
    headers = core.kept_headers(
        [("Content-Type", "a/b"), ("Set-Cookie", "s"), ("Location", "/x"), ("X-Y", "z")], POLICY
    )
    assert headers == (("content-type", "a/b"), ("location", "/x"))
    for body in (b'{"a": 1}', bytes(range(256))):
        resp = core.StoredResponse(201, headers, body)
        rec = Record("s", "k", State.COMPLETED, None, 1, 0, result=core.encode_response(resp))
        assert core.decode_response(rec) == resp
    replay = core.replay_headers(core.StoredResponse(201, headers, b"ab"))
    assert ("content-length", "2") in replay and ("idempotent-replayed", "true") in replay
    no_body = core.replay_headers(core.StoredResponse(204))
    assert all(n != "content-length" for n, _ in no_body)


def test_decode_refuses_other_records() -> None:
    """A record that holds no HTTP response is CorruptRecord."""
    rec = Record("s", "k", State.COMPLETED, None, 1, 0, result='{"x": 1}')
    with pytest.raises(CorruptRecord):
        core.decode_response(rec)


def test_policy_refuses_credentials_in_replays() -> None:
    """Set-Cookie and auth headers can never be allow-listed."""
    with pytest.raises(ConfigurationError):
        core.HttpPolicy(replay_headers=("content-type", "Set-Cookie"))
    with pytest.raises(ConfigurationError):
        core.HttpPolicy(header="bad header")


def test_problem_document() -> None:
    """problem+json with a stable type URI and Retry-After on 409."""
    p = core.problem("in-flight", "later", retry_after=0.2)
    assert p.status == 409 and p.type == core.PROBLEM_TYPE_BASE + "in-flight"
    assert ("retry-after", "1") in p.headers()
    assert b'"status": 409' in p.body()


def test_release_keeps_attempts_and_fingerprint() -> None:
    """A release is a failed record with the same attempts and fingerprint."""
    rec = Record("s", "k", State.IN_PROGRESS, "h1:x", 7, 2)
    w = core.release_write(rec, "status 500")
    assert (w.state, w.attempts, w.fingerprint, w.token) == (State.FAILED, 2, "h1:x", 7)


def test_match_route() -> None:
    """{param} matches one segment."""
    assert core.match_route(["/a", "/o/{id}/pay"], "/o/12/pay") == "/o/{id}/pay"
    assert core.match_route(["/o/{id}"], "/o/1/2") is None
