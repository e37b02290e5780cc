# SPDX-License-Identifier: MIT
"""HTTP idempotency decisions (docs/http.md), with no I/O: the drivers fetch, call these,
then write.

Defaults follow draft-ietf-httpapi-idempotency-key-header; every one is a field of
:class:`HttpPolicy`. The rules, in the order the drivers apply them:

1. A method outside ``policy.methods`` or a route whose requirement is ``off`` passes
   through untouched.
2. No ``Idempotency-Key`` header: a ``required`` route answers 400 ``missing-key``; an
   ``optional`` one passes through.
3. The header is an RFC 8941 sf-string (``"abc"``, escapes ``\\"`` and ``\\\\`` only) or,
   for the many clients that send it unquoted, a bare key of visible ASCII without
   spaces, commas, quotes or backslashes; 1..255 characters. Anything else (two fields
   joined ``"k1, k2"``, a quote inside, another escape, a byte past ASCII): 400
   ``invalid-key`` (:func:`parse_key`).
4. No principal (the caller's callable returned ``None``): 403 ``no-principal``; a key is
   never shared by clients the server cannot tell apart (``anonymous="pass"`` runs the
   request without storing it instead). An ``int`` principal is its decimal text; an
   empty one, or the text ``"None"`` (``str()`` of a missing id), raises
   :class:`~onceonly.errors.InvalidPrincipal` (a server bug, never a shared key).
5. The key's scope is ``policy.namespace + principal`` (the principal hashed, so no
   credential lands in the store): one key names one request of one client. Its
   fingerprint is the method, the **concrete path**, the **canonical query string**, the
   body (JSON canonically, or the fields the route chooses) and the chosen headers: the
   same key with any other request is 422 ``key-mismatch``, never a replay and never a
   fresh run. The route template is only a label (metrics, logs).
6. After the handler: 2xx, 3xx and deterministic 4xx are stored; 5xx only with
   ``store_server_errors``; 401, 403, 407, 408, 409, 423, 425 and 429 never (they depend
   on time or credentials); a response not stored gives the key back before it is sent.
   A 307 or 308 says "send this same request to another URL" (a router's trailing-slash
   redirect): nothing was served here, so the key is given back **unbound** (without
   its fingerprint), and the client that follows the redirect with the same key runs
   once there instead of getting 422.
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
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import quote_from_bytes, unquote_to_bytes

from onceonly._core.canonical import canonical_json
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
from onceonly.errors import ConfigurationError, InvalidKey, InvalidPayload, InvalidPrincipal

__all__ = [
    "NEVER_STORED_HEADERS",
    "PROBLEM_TYPE_BASE",
    "REDIRECTED",
    "UNKEPT",
    "HttpPolicy",
    "Pass",
    "Problem",
    "Proceed",
    "Requirement",
    "RouteRule",
    "StoredResponse",
    "body_identity",
    "canonical_query",
    "concrete_path",
    "decode_response",
    "encode_response",
    "encode_unavailable",
    "kept_headers",
    "match_route",
    "parse_key",
    "plan",
    "principal_text",
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

# "repeat this request, method and body, at Location": the request was not served here
_RESEND_REDIRECTS = frozenset({307, 308})

UNKEPT = "!"
"""Prefix of a :func:`should_store` reason for a served response that cannot be kept (a
stream, over the limit): the key completes without a replayable response."""

REDIRECTED = ">"
"""Prefix of a :func:`should_store` reason for a 307/308: the key is given back unbound
(its fingerprint forgotten), so the redirected request may use it."""


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
        body_fields: only these top-level fields of a JSON object body count in the
            fingerprint (a missing one counts as ``null``), for a body whose other
            fields do not decide the effect (a client timestamp, a trace id). ``None``:
            the whole body.
        ignore_fields: top-level fields of a JSON object body left out of the
            fingerprint. A body that is not a JSON object is fingerprinted whole.

    .. versionchanged:: 0.3
        ``body_fields`` and ``ignore_fields``.
    """

    requirement: Requirement = Requirement.OPTIONAL
    wait: float = 0.0
    atomic: bool = False
    rerun_unstored: bool = False
    body_fields: tuple[str, ...] | None = None
    ignore_fields: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.requirement, Requirement):
            object.__setattr__(self, "requirement", Requirement(self.requirement))
        if self.atomic and self.requirement is not Requirement.REQUIRED:
            raise ConfigurationError("an atomic route requires the key (its handler needs tx)")
        if not 0 <= self.wait < 3600:
            raise ConfigurationError(f"wait must be within [0, 3600) seconds, not {self.wait}")
        for what in ("body_fields", "ignore_fields"):
            value = getattr(self, what)
            if value is None:
                continue
            if isinstance(value, str) or not all(isinstance(f, str) for f in value):
                raise ConfigurationError(f"{what} must be a tuple of field names, not {value!r}")
            object.__setattr__(self, what, tuple(value))
        if self.body_fields is not None and self.ignore_fields:
            raise ConfigurationError("give body_fields or ignore_fields, not both")


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
        namespace: keeps the keys of apps that share one store and one table apart
            (letters, digits, ``.``, ``_``, ``-``; up to 64). Keys are scoped by it and
            the principal, never by the path (docs/http.md, "Identity").

    .. versionchanged:: 0.3
        ``namespace``.
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
    namespace: str = ""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9._-]{0,64}", self.namespace):
            raise ConfigurationError(
                f"namespace {self.namespace!r}: use up to 64 letters, digits, '.', '_', '-'"
            )
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


def principal_text(principal: object) -> str | None:
    """The principal as text: ``None`` stays ``None`` (no client), an ``int`` or a UUID is
    its text.

    Raises:
        InvalidPrincipal: empty (or blank) text, the text ``"None"`` (``str()`` of an
            anonymous user's id), a bool, or any other type: each would put clients
            the server cannot tell apart in one scope.
    """
    if principal is None:
        return None
    if isinstance(principal, bool):
        raise InvalidPrincipal(f"the principal callable returned {principal!r}, not an id")
    if isinstance(principal, int):
        return str(principal)
    if isinstance(principal, uuid.UUID):
        return str(principal)
    if not isinstance(principal, str):
        raise InvalidPrincipal(
            "the principal callable must return str, int, UUID or None, "
            f"not {type(principal).__name__}"
        )
    if not principal.strip() or principal.strip() == "None":
        raise InvalidPrincipal(
            f"the principal callable returned {principal!r}: return None for a client "
            "you cannot identify (an anonymous user), never a constant text"
        )
    return principal


def scope_of(principal: str, namespace: str = "") -> str:
    """The record scope ``http:<namespace>:<principal hash>``.

    Not the method, path or route: a key names one request of one client, so the same
    key with another request finds the record and its fingerprint answers 422.
    """
    return f"http:{namespace}:{_hash(principal)[:32]}"


_BARE_KEY = re.compile(r"[!#$%&'()*+\-./0-9:;<=>?@A-Z\[\]^_`a-z{|}~]+")
_SF_STRING = re.compile(r'"((?:[ !#-\[\]-~]|\\["\\])*)"')
_SF_ESCAPE = re.compile(r'\\(["\\])')


def parse_key(raw: str) -> str:
    """The key in an ``Idempotency-Key`` field value.

    The value is an RFC 8941 sf-string (``"abc"``; inside, printable ASCII with ``\\"``
    and ``\\\\`` as the only escapes), or, for compatibility with the clients that send
    it unquoted, a bare key of visible ASCII without ``"``, ``,``, ``\\`` or spaces.
    Spaces around the value are ignored.

    Raises:
        InvalidKey: anything else: two fields joined (``"a", "b"`` or ``a, b``), a quote
            inside, another escape, parameters, a character past ASCII, an empty key or
            one over 255 characters.
    """
    text = raw.strip(" \t")
    if _BARE_KEY.fullmatch(text):
        return validate_key(text)
    quoted = _SF_STRING.fullmatch(text)
    if quoted is None:
        if "," in text:
            raise InvalidKey("one key per request: the header holds a list (two fields?)")
        raise InvalidKey(
            "not a structured-field string (RFC 8941: printable ASCII in double quotes, "
            'with \\" and \\\\ as the only escapes) nor a bare key of visible ASCII'
        )
    return validate_key(_SF_ESCAPE.sub(r"\1", quoted.group(1)))


def plan(
    method: str,
    route: str,
    headers: Mapping[str, str],
    principal: object,
    rule: RouteRule,
    policy: HttpPolicy,
    *,
    key_fields: int = 1,
) -> Pass | Proceed | Problem:
    """What to do with a request before reading its body (rules 1-5 of the module doc).

    Args:
        method: the upper-case method.
        route: the route template (a label only: the scope does not depend on it).
        headers: lower-case names to values.
        principal: what the principal callable returned (``str``, ``int``, UUID, None).
        rule: the route's rule.
        policy: the settings.
        key_fields: how many header fields carried the key, where the server tells
            (ASGI hands each field apart): more than one is 400 ``invalid-key`` before
            their joined value is parsed (``"a`` and ``b"`` join into the valid
            ``"a, b"``). WSGI servers join the fields themselves; the join is parsed.

    Returns:
        Pass, a Problem to answer, or Proceed with the record's scope and the key.

    Raises:
        InvalidPrincipal: see :func:`principal_text`.
    """
    if method not in policy.methods or rule.requirement is Requirement.OFF:
        return Pass()
    raw = headers.get(policy.header.lower())
    if raw is None:
        if rule.requirement is Requirement.REQUIRED:
            return problem("missing-key", f"this route requires the {policy.header} header")
        return Pass()
    try:
        if key_fields > 1:
            raise InvalidKey(f"one key per request, not {key_fields} header fields")
        key = parse_key(raw)
    except InvalidKey as exc:
        return problem("invalid-key", f"{policy.header}: {exc.message}")
    who = principal_text(principal)
    if who is None:
        if policy.anonymous == "pass":
            return Pass()
        return problem(
            "no-principal",
            "the request carries an idempotency key but no client identity, and responses "
            "are never shared between clients; authenticate the request",
        )
    return Proceed(scope_of(who, policy.namespace), key)


def concrete_path(prefix: str, path: str, *, may_hold_prefix: bool = False) -> str:
    """The path the client asked for: the mount prefix, then the app's path.

    The prefix is where the app is mounted (WSGI ``SCRIPT_NAME``, ASGI ``root_path``):
    two apps mounted under ``/a`` and ``/b`` that share a store must not share a
    request's identity. WSGI's ``PATH_INFO`` never holds ``SCRIPT_NAME``; an ASGI
    ``path`` may or may not hold ``root_path`` (servers and the spec have said both), so
    with ``may_hold_prefix`` a path that starts with the prefix at a segment boundary
    is taken to hold it already, as Starlette's router does.

    Args:
        prefix: the mount prefix (``""``: mounted at the root).
        path: the app's path (``PATH_INFO``, ASGI ``path``).
        may_hold_prefix: ``path`` may already start with ``prefix`` (ASGI).

    Returns:
        The concrete path, ``/`` when both are empty.
    """
    prefix = prefix.rstrip("/")
    if may_hold_prefix and prefix and (path == prefix or path.startswith(prefix + "/")):
        return path
    return (prefix + path) or "/"


def canonical_query(query: str | bytes) -> str:
    """The query string in one spelling per meaning.

    Split on ``&``, each part on its first ``=``; ``+`` is a space and percent-escapes
    are decoded (to bytes, so every byte sequence stays distinct); then each name and
    value is percent-encoded again, and the pairs are sorted by name, keeping the order
    of a repeated name's values (``?tag=a&tag=b`` is not ``?tag=b&tag=a``). Empty parts
    are dropped; ``?a`` and ``?a=`` are the same. ``query`` is the raw query: bytes, or
    text holding them one character per byte (latin-1, as ASGI and WSGI give it).
    """
    if isinstance(query, str):
        try:
            data = query.encode("latin-1")
        except UnicodeEncodeError:
            data = query.encode("utf-8", "surrogateescape")
    else:
        data = query
    pairs: list[tuple[bytes, bytes]] = []
    for part in data.split(b"&"):
        if not part:
            continue
        name, _, value = part.partition(b"=")
        pairs.append(
            (
                unquote_to_bytes(name.replace(b"+", b" ")),
                unquote_to_bytes(value.replace(b"+", b" ")),
            )
        )
    pairs.sort(key=lambda pair: pair[0])
    return "&".join(
        f"{quote_from_bytes(n, safe='')}={quote_from_bytes(v, safe='')}" for n, v in pairs
    )


class _NotJson(Exception):
    pass


def _no_constant(name: str) -> Any:
    raise _NotJson(name)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _NotJson("a duplicate member name")
    return out


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def body_identity(body: bytes, content_type: str | None, rule: RouteRule | None = None) -> bytes:
    """What of ``body`` decides the request's effect, as bytes.

    A JSON body (``application/json``, ``application/*+json``) that parses is its
    canonical JSON (``_core/canonical.py``: member order and whitespace do not count;
    numbers by exact decimal value) prefixed ``json:``, restricted to the rule's
    ``body_fields`` or without its ``ignore_fields`` when it is an object. Anything else
    (another type, JSON that does not parse, duplicate members, NaN) is ``raw:`` and its
    bytes.
    """
    if _is_json(content_type):
        try:
            value = json.loads(
                body.decode("utf-8"),
                parse_float=Decimal,
                parse_constant=_no_constant,
                object_pairs_hook=_unique,
            )
            fields: Iterable[str] | None = None
            if rule is not None and isinstance(value, dict):
                if rule.body_fields is not None:
                    fields = rule.body_fields
                elif rule.ignore_fields:
                    value = {k: v for k, v in value.items() if k not in rule.ignore_fields}
            return b"json:" + canonical_json(value, fields)
        except (UnicodeDecodeError, ValueError, _NotJson, InvalidPayload, RecursionError):
            pass
    return b"raw:" + body


def request_fingerprint(
    method: str,
    path: str,
    query: str | bytes,
    body: bytes,
    headers: Mapping[str, str],
    policy: HttpPolicy,
    rule: RouteRule | None = None,
) -> str:
    """``h2:`` + SHA-256 of everything that decides the request's effect.

    Args:
        method: the upper-case method.
        path: the concrete path (``/orders/1/pay``, not the route template); a trailing
            slash does not count (``/items/`` is ``/items``).
        query: the raw query string (:func:`canonical_query`).
        body: the request body (:func:`body_identity`, by the ``content-type`` header).
        headers: lower-case names to values.
        policy: its ``fingerprint_headers`` count too.
        rule: the route's ``body_fields`` / ``ignore_fields``.

    Returns:
        The fingerprint stored with the key; the same key with another fingerprint is
        422 ``key-mismatch``.
    """
    h = hashlib.sha256()
    chosen = [[n, headers.get(n)] for n in policy.fingerprint_headers]
    # a trailing slash does not count: routers redirect one spelling to the other
    # (307/308), and the client follows with the same key; its retry may use either
    head = [method, path.rstrip("/") or "/", canonical_query(query), chosen]
    h.update(json.dumps(head).encode("utf-8", "surrogatepass"))
    h.update(b"\n")
    h.update(body_identity(body, headers.get("content-type"), rule))
    return "h2:" + h.hexdigest()


def should_store(
    status: int, headers: Mapping[str, str], policy: HttpPolicy
) -> tuple[bool, str | None]:
    """Whether a response with ``status`` and ``headers`` is stored, and why not.

    Returns:
        ``(True, None)``, or ``(False, reason)``; a reason worth a warning starts with
        :data:`UNKEPT` (a stream or an oversized body: the effect happened but cannot be
        replayed); a 307/308 starts with :data:`REDIRECTED` (nothing was served here).
    """
    if status in _RESEND_REDIRECTS:
        return False, f"{REDIRECTED}status {status} redirects the request; it is not stored"
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
