# SPDX-License-Identifier: MIT
"""The pure HTTP decisions of onceonly._core.http."""

from __future__ import annotations

import uuid

import pytest

from onceonly._core import http as core
from onceonly._core.state import Record, State
from onceonly.errors import ConfigurationError, CorruptRecord, InvalidKey, InvalidPrincipal

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


def test_plan_scopes_by_principal_and_namespace_only() -> None:
    """The scope is the principal (hashed) and the namespace: never the method or path."""
    h = {"idempotency-key": '"abc"'}
    a = core.plan("POST", "/o", h, "secret-api-key", REQ, POLICY)
    assert isinstance(a, core.Proceed) and a.key == "abc"
    assert "secret-api-key" not in a.scope and a.scope.startswith("http::")
    same = [
        core.plan("PATCH", "/o", h, "secret-api-key", REQ, POLICY),
        core.plan("POST", "/p/" + "x" * 300, h, "secret-api-key", REQ, POLICY),
    ]
    assert all(isinstance(o, core.Proceed) and o.scope == a.scope for o in same)
    other = core.plan("POST", "/o", h, "other", REQ, POLICY)
    billing = core.plan("POST", "/o", h, "secret-api-key", REQ, core.HttpPolicy(namespace="b"))
    assert isinstance(other, core.Proceed) and other.scope != a.scope
    assert isinstance(billing, core.Proceed) and billing.scope.startswith("http:b:")
    assert billing.scope != a.scope and len(billing.scope) <= 255
    with pytest.raises(ConfigurationError):
        core.HttpPolicy(namespace="a:b")


@pytest.mark.parametrize("bad", ["", "  ", "None", True, 1.5, b"u1", object()])
def test_principal_that_names_no_client_is_refused(bad: object) -> None:
    """Empty text, the text "None", a bool or another type raise InvalidPrincipal."""
    with pytest.raises(InvalidPrincipal):
        core.plan("POST", "/", {"idempotency-key": "k"}, bad, REQ, POLICY)


def test_principal_int_and_uuid_are_their_text() -> None:
    """An int principal (Django's user.pk) is its decimal text; a UUID its canonical text."""
    h = {"idempotency-key": "k"}
    ints = core.plan("POST", "/", h, 42, REQ, POLICY)
    text = core.plan("POST", "/", h, "42", REQ, POLICY)
    assert isinstance(ints, core.Proceed) and ints == text
    u = uuid.UUID(int=7)
    assert core.plan("POST", "/", h, u, REQ, POLICY) == core.plan(
        "POST", "/", h, str(u), REQ, POLICY
    )


@pytest.mark.parametrize(
    ("raw", "key"),
    [("abc", "abc"), ('"abc"', "abc"), (' "a b" ', "a b"), ('"a\\"b"', 'a"b'),
     ('"a\\\\b"', "a\\b"), ("k-1_2.3~x:y/z=;", "k-1_2.3~x:y/z=;")],
)  # fmt: skip
def test_parse_key_accepts_sf_strings_and_bare_keys(raw: str, key: str) -> None:
    """An RFC 8941 sf-string is unquoted and unescaped; a bare visible-ASCII key is kept."""
    assert core.parse_key(raw) == key


@pytest.mark.parametrize(
    "raw",
    ["k1, k2", '"k1", "k2"', '"a"b"', '"a\\nb"', '"abc', "a b", 'a"b', "a\\b", "café",
     '"café"', '""', "", '"abc";p=1', '"' + "x" * 256 + '"', "\x00"],
)  # fmt: skip
def test_parse_key_refuses_everything_else(raw: str) -> None:
    """Lists, inner quotes, other escapes, parameters and non-ASCII are 400 invalid-key."""
    with pytest.raises(InvalidKey):
        core.parse_key(raw)
    p = core.plan("POST", "/", {"idempotency-key": raw}, "u", REQ, POLICY)
    assert isinstance(p, core.Problem) and p.name == "invalid-key" and p.status == 400


def test_canonical_query() -> None:
    """Order of names, + and %20, escapes of plain characters do not count; values do."""
    q = core.canonical_query
    assert q("b=2&a=1") == q("a=1&b=2") == q(b"a=%31&&b=2") == "a=1&b=2"
    assert q("a=x+y") == q("a=x%20y") and q("a") == q("a=")
    assert q("t=a&t=b") != q("t=b&t=a")  # a repeated name keeps its order
    assert q("amount=5") != q("amount=500") and q("a=%FF") != q("a=%FE")
    assert q("x=\xc3\xa9") == q("x=%C3%A9")  # raw bytes (latin-1 text) and their escapes


def test_body_identity() -> None:
    """JSON canonically (order, whitespace, exact numbers); anything else by its bytes."""
    j = "application/json"
    b = core.body_identity
    assert b(b'{"b": 1, "a": 2}', j) == b(b'{"a":2,"b":1}', "application/merge-patch+json")
    assert b(b'{"a": 1}', j) == b(b'{"a": 1.0}', j)
    assert b(b'{"a": 0.1}', j) != b(b'{"a": 0.10000000000000001}', j)
    assert b(b'{"a": 9007199254740993}', j) != b(b'{"a": 9007199254740992}', j)
    assert b(b'{"b": 1, "a": 2}', "text/plain") != b(b'{"a":2,"b":1}', "text/plain")
    assert b(b'{"a":1,"a":2}', j) == b"raw:" + b'{"a":1,"a":2}'  # duplicate members: raw
    assert b(b'{"a":NaN}', j).startswith(b"raw:") and b(b"\xff", j).startswith(b"raw:")
    only = core.RouteRule(body_fields=("amount",))
    assert b(b'{"amount":5,"ts":1}', j, only) == b(b'{"ts":2,"amount":5}', j, only)
    assert b(b'{"amount":5,"ts":1}', j, only) != b(b'{"amount":6,"ts":1}', j, only)
    skip = core.RouteRule(ignore_fields=("ts",))
    assert b(b'{"amount":5,"ts":1}', j, skip) == b(b'{"amount":5,"ts":2}', j, skip)
    assert b(b'{"amount":5,"ts":1}', j, skip) != b(b'{"amount":6,"ts":1}', j, skip)
    assert b(b"[1]", j, skip) == b(b"[1]", j)  # not an object: whole
    with pytest.raises(ConfigurationError):
        core.RouteRule(body_fields=("a",), ignore_fields=("b",))


def test_plan_no_principal() -> None:
    """No principal: 403 by default, pass with anonymous='pass'."""
    h = {"idempotency-key": "k"}
    p = core.plan("POST", "/", h, None, REQ, POLICY)
    assert isinstance(p, core.Problem) and p.status == 403
    lax = core.HttpPolicy(anonymous="pass")
    assert isinstance(core.plan("POST", "/", h, None, REQ, lax), core.Pass)


def test_fingerprint_covers_method_path_query_body_and_chosen_headers() -> None:
    """Each part changes the fingerprint; unchosen headers do not."""
    pol = core.HttpPolicy(fingerprint_headers=("X-A",))
    j = {"x-a": "1", "content-type": "application/json"}

    def fp(m: str, p: str, q: str, body: bytes, h: dict[str, str]) -> str:
        return core.request_fingerprint(m, p, q, body, h, pol)

    base = fp("POST", "/o/1", "a=1&b=2", b'{"x": 1, "y": 2}', j)
    assert base.startswith("h2:")
    assert base == fp("POST", "/o/1", "b=2&a=1", b'{"y":2,"x":1}', {**j, "x-b": "2"})
    for other in [
        fp("PATCH", "/o/1", "a=1&b=2", b'{"x": 1, "y": 2}', j),
        fp("POST", "/o/2", "a=1&b=2", b'{"x": 1, "y": 2}', j),
        fp("POST", "/o/1", "a=1&b=3", b'{"x": 1, "y": 2}', j),
        fp("POST", "/o/1", "a=1&b=2", b'{"x": 1, "y": 3}', j),
        fp("POST", "/o/1", "a=1&b=2", b'{"x": 1, "y": 2}', {**j, "x-a": "2"}),
        fp("POST", "/o/1", "a=1&b=2", b'{"x": 1, "y": 2}', {**j, "content-type": "text/plain"}),
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


def test_concrete_path_holds_the_mount_prefix() -> None:
    """SCRIPT_NAME/root_path then the app's path; an ASGI path may already hold it."""
    assert core.concrete_path("/a", "/orders") == "/a/orders"
    assert core.concrete_path("/a/", "/orders") == "/a/orders"
    assert core.concrete_path("", "") == "/"
    # WSGI: PATH_INFO never holds SCRIPT_NAME, so /a/a/orders stays itself
    assert core.concrete_path("/a", "/a/orders") == "/a/a/orders"
    assert core.concrete_path("/a", "/a/orders", may_hold_prefix=True) == "/a/orders"
    assert core.concrete_path("/a", "/ab/orders", may_hold_prefix=True) == "/a/ab/orders"
    fp = [core.request_fingerprint("POST", p, "", b"", {}, POLICY) for p in ("/a/o", "/b/o")]
    assert fp[0] != fp[1]


def test_a_trailing_slash_does_not_count_in_the_fingerprint() -> None:
    """/items and /items/ are one request (a router redirects one to the other)."""
    fp = [core.request_fingerprint("POST", p, "", b"", {}, POLICY) for p in ("/i", "/i/", "/j")]
    assert fp[0] == fp[1] != fp[2]
    root = [core.request_fingerprint("POST", p, "", b"", {}, POLICY) for p in ("/", "//")]
    assert root[0] == root[1]


def test_307_and_308_give_the_key_back_unbound_other_3xx_are_stored() -> None:
    """307/308 are REDIRECTED (not stored); 301, 302 and 303 are stored."""
    head = {"content-length": "0", "location": "/x/"}
    for status in (307, 308):
        ok, reason = core.should_store(status, head, POLICY)
        assert not ok and reason is not None and reason.startswith(core.REDIRECTED)
    for status in (301, 302, 303):
        assert core.should_store(status, head, POLICY) == (True, None)


def test_more_than_one_key_field_is_invalid() -> None:
    """Two fields are 400 even when their join parses as one sf-string."""
    h = {"idempotency-key": '"a, b"'}
    assert isinstance(core.plan("POST", "/", h, "u", REQ, POLICY), core.Proceed)
    two = core.plan("POST", "/", h, "u", REQ, POLICY, key_fields=2)
    assert isinstance(two, core.Problem) and two.name == "invalid-key"


def test_an_encoded_replay_varies_on_accept_encoding() -> None:
    """A stored Content-Encoding adds Vary: Accept-Encoding, merged with a stored Vary."""
    gz = core.replay_headers(core.StoredResponse(200, (("content-encoding", "gzip"),), b"x"))
    assert ("vary", "Accept-Encoding") in gz
    both = core.replay_headers(
        core.StoredResponse(200, (("content-encoding", "br"), ("vary", "Origin")), b"x")
    )
    assert [v for n, v in both if n == "vary"] == ["Origin, Accept-Encoding"]
    kept = core.replay_headers(
        core.StoredResponse(200, (("content-encoding", "br"), ("vary", "accept-encoding")), b"")
    )
    assert [v for n, v in kept if n == "vary"] == ["accept-encoding"]
    plain = core.replay_headers(core.StoredResponse(200, (), b"x"))
    assert not any(n == "vary" for n, _ in plain)
