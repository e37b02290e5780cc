# SPDX-License-Identifier: MIT
"""HTTP idempotency decisions (docs/http.md), with no I/O: the drivers fetch, call these,
then write.

Defaults follow draft-ietf-httpapi-idempotency-key-header; every one is a field of
:class:`HttpPolicy`. The rules, in the order the drivers apply them:

1. A method outside ``policy.methods`` or a route whose requirement is ``off`` passes
   through untouched.
2. No ``Idempotency-Key`` header: a ``required`` route answers 400 ``missing-key``; an
   ``optional`` one passes through.
3. A key that is empty, longer than 255 characters or holds a control character: 400
   ``invalid-key``. A key written as a structured-field string (``"abc"``) is unquoted.
4. No principal (the caller's callable returned ``None``): 403 ``no-principal``; a key is
   never shared by clients the server cannot tell apart (``anonymous="pass"`` runs the
   request without storing it instead).
5. The key's scope is ``method + route template + principal`` (the principal hashed, so
   no credential lands in the store); its fingerprint is ``method + route + body`` (+ the
   chosen headers): the same key with another request is 422 ``key-mismatch``.
6. After the handler: 2xx, 3xx and deterministic 4xx are stored; 5xx only with
   ``store_server_errors``; 401, 403, 407, 408, 409, 423, 425 and 429 never (they depend
   on time or credentials); a response not stored gives the key back before it is sent.
   A response without ``Content-Length`` (a stream) or larger than
   ``max_response_bytes`` cannot be kept: the key completes as served and a duplicate
   gets 409 ``replay-unavailable`` (``RouteRule.rerun_unstored``: given back instead).
7. A replay carries the stored status, body and the allow-listed headers, plus
   ``Idempotent-Replayed: true``; ``Set-Cookie`` and authentication headers are never
   stored.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from onceonly._core.http_replay import (
    BODY_HEADERS,
    NO_BODY,
    StoredResponse,
    decode_response,
    encode_response,
    encode_unavailable,
    replay_headers,
    response_doc,
    response_from_doc,
)
from onceonly._core.keys import validate_key
from onceonly._core.state import Record, State, Write
from onceonly.errors import ConfigurationError, InvalidKey

__all__ = [
    "NEVER_STORED_HEADERS",
    "PROBLEM_TYPE_BASE",
    "HttpPolicy",
    "Pass",
    "Problem",
    "Proceed",
    "Requirement",
    "RouteRule",
    "StoredResponse",
    "decode_response",
    "encode_response",
    "encode_unavailable",
    "kept_headers",
    "match_route",
    "plan",
    "problem",
    "release_write",
    "replay_headers",
    "request_fingerprint",
    "response_doc",
    "response_from_doc",
    "scope_of",
    "should_store",
]

PROBLEM_TYPE_BASE = "https://github.com/onceonly/onceonly/blob/main/docs/http.md#"
"""Every problem ``type`` is this plus the case's name (``missing-key``, ``key-mismatch``…)."""

MIB = 1024 * 1024

NEVER_STORED_HEADERS = frozenset(
    {
        "set-cookie",
        "set-cookie2",
        "authorization",
        "proxy-authorization",
        "www-authenticate",
        "proxy-authenticate",
        "cookie",
        "content-length",
        "transfer-encoding",
        "connection",
    }
)
"""Headers a replay never carries, whatever the allow-list says (credentials, framing)."""

# time- or credential-dependent 4xx: a retry may well succeed, so they are not replayed
_TRANSIENT_4XX = frozenset({401, 403, 407, 408, 409, 423, 425, 429})


class Requirement(str, enum.Enum):
    """Whether a route takes an idempotency key."""

    REQUIRED = "required"  # no key: 400
    OPTIONAL = "optional"  # no key: runs as usual, unprotected
    OFF = "off"  # the header is ignored


@dataclass(frozen=True)
class RouteRule:
    """What one route does with idempotency keys.

    Args:
        requirement: required, optional or off.
        wait: seconds a request waits for the same key's request in progress to finish
            (then replays it) before answering 409; 0 answers 409 at once.
        atomic: atomic mode (SQL stores): the claim, the handler's writes through ``tx``
            and the stored response commit in one transaction; the key is required.
        rerun_unstored: a response that cannot be kept (a stream, over the size limit)
            gives the key back, so a retry runs the handler again; by default the key
            completes and a duplicate gets 409 ``replay-unavailable``.
    """

    requirement: Requirement = Requirement.OPTIONAL
    wait: float = 0.0
    atomic: bool = False
    rerun_unstored: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.requirement, Requirement):
            object.__setattr__(self, "requirement", Requirement(self.requirement))
        if self.atomic and self.requirement is not Requirement.REQUIRED:
            raise ConfigurationError("an atomic route requires the key (its handler needs tx)")
        if not 0 <= self.wait < 3600:
            raise ConfigurationError(f"wait must be within [0, 3600) seconds, not {self.wait}")


@dataclass(frozen=True)
class HttpPolicy:
    """The HTTP idempotency settings (every default from the IETF draft).

    Args:
        header: the request header carrying the key.
        methods: the methods keys apply to.
        fingerprint_headers: request headers that count in the fingerprint too.
        replay_headers: response headers stored and replayed.
        max_request_bytes: larger request bodies carrying a key get 413.
        max_response_bytes: larger responses are not kept (see ``RouteRule.rerun_unstored``).
        store_server_errors: store 5xx responses too (default: release, so a retry runs).
        anonymous: ``"reject"`` (403) or ``"pass"`` (run unprotected) when the request
            has a key but the principal callable found no principal.
    """

    header: str = "Idempotency-Key"
    methods: frozenset[str] = frozenset({"POST", "PATCH"})
    fingerprint_headers: tuple[str, ...] = ()
    replay_headers: tuple[str, ...] = (
        "content-type",
        "location",
        "etag",
        "link",
        "cache-control",
    )
    max_request_bytes: int = MIB
    max_response_bytes: int = MIB
    store_server_errors: bool = False
    anonymous: str = "reject"

    def __post_init__(self) -> None:
        object.__setattr__(self, "methods", frozenset(m.upper() for m in self.methods))
        lowered = tuple(h.lower() for h in self.replay_headers)
        refused = sorted(set(lowered) & NEVER_STORED_HEADERS)
        if refused:
            raise ConfigurationError(f"these headers are never replayed: {', '.join(refused)}")
        object.__setattr__(self, "replay_headers", lowered)
        fp = tuple(h.lower() for h in self.fingerprint_headers)
        object.__setattr__(self, "fingerprint_headers", fp)
        if self.anonymous not in ("reject", "pass"):
            raise ConfigurationError("anonymous must be 'reject' or 'pass'")
        if self.max_request_bytes < 0 or self.max_response_bytes < 0:
            raise ConfigurationError("body limits must not be negative")
        if not self.header or not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", self.header):
            raise ConfigurationError(f"{self.header!r} is not a header name")


@dataclass(frozen=True)
class Problem:
    """An ``application/problem+json`` answer (RFC 9457)."""

    status: int
    name: str
    title: str
    detail: str
    retry_after: int | None = None

    @property
    def type(self) -> str:
        """The stable URI naming this case."""
        return PROBLEM_TYPE_BASE + self.name

    def body(self) -> bytes:
        """The JSON document."""
        doc = {"type": self.type, "title": self.title, "status": self.status}
        doc["detail"] = self.detail
        return json.dumps(doc).encode()

    def headers(self) -> list[tuple[str, str]]:
        """Content-Type, Content-Length and, for 409/503, Retry-After."""
        out = [
            ("content-type", "application/problem+json"),
            ("content-length", str(len(self.body()))),
        ]
        if self.retry_after is not None:
            out.append(("retry-after", str(self.retry_after)))
        return out


_TITLES = {
    "missing-key": (400, "Idempotency key missing"),
    "invalid-key": (400, "Invalid idempotency key"),
    "no-principal": (403, "No principal for the idempotency key"),
    "request-too-large": (413, "Request body too large for an idempotent request"),
    "key-mismatch": (422, "Idempotency key reused with another request"),
    "in-flight": (409, "A request with this idempotency key is in progress"),
    "key-exhausted": (409, "This idempotency key failed too many times"),
    "store-unavailable": (503, "Idempotency store unavailable"),
    "response-not-stored": (500, "The response could not be stored; nothing was committed"),
    "replay-unavailable": (409, "The request with this key was served; its response was not kept"),
}


def problem(name: str, detail: str, retry_after: float | None = None) -> Problem:
    """The problem named ``name`` (one of the documented cases)."""
    status, title = _TITLES[name]
    after = None if retry_after is None else max(1, int(retry_after + 0.999))
    return Problem(status, name, title, detail, after)


@dataclass(frozen=True)
class Pass:
    """Let the request through without idempotency."""


@dataclass(frozen=True)
class Proceed:
    """Claim ``key`` in ``scope`` once the body is read."""

    scope: str
    key: str


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def scope_of(method: str, route: str, principal: str) -> str:
    """The record scope: ``http:METHOD:route:<principal hash>`` (hashed route if long)."""
    who = _hash(principal)[:32]
    scope = f"http:{method}:{route}:{who}"
    if len(scope) > 255:
        scope = f"http:{method}:#{_hash(route)[:32]}:{who}"
    return scope


def plan(
    method: str,
    route: str,
    headers: Mapping[str, str],
    principal: str | None,
    rule: RouteRule,
    policy: HttpPolicy,
) -> Pass | Proceed | Problem:
    """What to do with a request before reading its body (rules 1-5 of the module doc).

    ``headers`` maps lower-case names to values.
    """
    if method not in policy.methods or rule.requirement is Requirement.OFF:
        return Pass()
    raw = headers.get(policy.header.lower())
    if raw is None:
        if rule.requirement is Requirement.REQUIRED:
            return problem("missing-key", f"this route requires the {policy.header} header")
        return Pass()
    key = raw.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    try:
        key = validate_key(key)
    except InvalidKey as exc:
        return problem("invalid-key", f"{policy.header}: {exc.message}")
    if principal is None:
        if policy.anonymous == "pass":
            return Pass()
        return problem(
            "no-principal",
            "the request carries an idempotency key but no client identity, and responses "
            "are never shared between clients; authenticate the request",
        )
    return Proceed(scope_of(method, route, principal), key)


def request_fingerprint(
    method: str,
    route: str,
    body: bytes,
    headers: Mapping[str, str],
    names: Iterable[str] = (),
) -> str:
    """``h1:`` + SHA-256 of the method, route, chosen headers and body."""
    h = hashlib.sha256()
    chosen = [[n, headers.get(n)] for n in names]
    h.update(json.dumps([method, route, chosen]).encode("utf-8", "surrogatepass"))
    h.update(b"\n")
    h.update(body)
    return "h1:" + h.hexdigest()


def should_store(
    status: int, headers: Mapping[str, str], policy: HttpPolicy
) -> tuple[bool, str | None]:
    """Whether a response with ``status`` and ``headers`` is stored, and why not.

    Returns:
        ``(True, None)``, or ``(False, reason)``; a reason worth a warning starts with
        ``"!"`` (a stream or an oversized body: the effect happened but cannot be
        replayed).
    """
    if status == 429 or status in _TRANSIENT_4XX:
        return False, f"status {status} is not stored"
    if status >= 500 and not policy.store_server_errors:
        return False, f"status {status} is not stored"
    if status < 200:
        return False, f"status {status} is not stored"
    length = headers.get("content-length")
    if status in NO_BODY:
        return True, None
    if length is None:
        return False, "!a streamed response (no Content-Length) is not stored"
    try:
        size = int(length)
    except ValueError:
        return False, "!a response with an invalid Content-Length is not stored"
    if size > policy.max_response_bytes:
        return False, f"!a response of {size} bytes is over the {policy.max_response_bytes} limit"
    return True, None


def kept_headers(
    headers: Iterable[tuple[str, str]], policy: HttpPolicy
) -> tuple[tuple[str, str], ...]:
    """The allow-listed response headers, lower-cased, in order."""
    allow = (set(policy.replay_headers) | BODY_HEADERS) - NEVER_STORED_HEADERS
    return tuple((n.lower(), v) for n, v in headers if n.lower() in allow)


def release_write(record: Record, reason: str) -> Write:
    """Give the claim ``record`` back without counting an attempt: a retry runs again.

    The fingerprint stays, so the same key with another request is still a mismatch.
    """
    return Write(
        state=State.FAILED,
        token=record.token,
        fingerprint=record.fingerprint,
        attempts=record.attempts,
        error=reason[:500],
    )


_PARAM = re.compile(r"\{[^/{}]+\}")


def match_route(templates: Iterable[str], path: str) -> str | None:
    """The first template matching ``path`` (``{name}`` matches one path segment)."""
    for template in templates:
        pattern = "^" + "".join(
            "[^/]+" if _PARAM.fullmatch(part) else re.escape(part)
            for part in re.split(r"(\{[^/{}]+\})", template)
            if part
        )
        if re.fullmatch(pattern + "$", path):
            return template
    return None
