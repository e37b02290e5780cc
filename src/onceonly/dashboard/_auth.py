# SPDX-License-Identifier: MIT
"""Who may write: a configured token, sent as ``Authorization: Bearer`` or exchanged at
the login form for a signed session cookie; cookie-authenticated forms also carry a
CSRF token bound to the session.

Invariants:

* No token configured: every write is refused (the dashboard is read-only).
* The cookie holds no secret: ``issued.nonce.signature``, an HMAC under a key derived
  from the token, so changing the token ends every session. Sessions last
  :data:`SESSION_SECONDS`.
* A session is valid only while this process remembers it: logging out forgets it, so a
  cookie copied before the logout no longer works. The list lives in memory: a restart
  logs everyone out, and every process serving the dashboard keeps its own (serve it
  from one process). At most :data:`MAX_SESSIONS` are kept; the oldest goes first.
* Every comparison of a secret is constant-time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

__all__ = ["COOKIE", "MAX_SESSIONS", "SESSION_SECONDS", "Auth", "Verdict"]

COOKIE = "onceonly_dashboard"
SESSION_SECONDS = 12 * 3600
MAX_SESSIONS = 1000


@dataclass(frozen=True)
class Verdict:
    """Whether a write may go ahead: ``status`` 0 (yes), 401 or 403, and why."""

    status: int
    reason: str = ""


class Auth:
    """Checks writes against ``token`` (``None``: writes are refused).

    Args:
        token: the operator token.
    """

    def __init__(self, token: str | None) -> None:
        self.token = token or None
        secret = (self.token or "").encode()
        self._key = hashlib.sha256(b"onceonly-dashboard\0" + secret).digest()
        self._live: dict[str, int] = {}  # session id -> issued (insertion order: oldest first)

    @property
    def enabled(self) -> bool:
        """Whether writes are possible at all."""
        return self.token is not None

    def _sign(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def token_matches(self, candidate: str) -> bool:
        """Whether ``candidate`` is the configured token."""
        if self.token is None:
            return False
        return hmac.compare_digest(candidate.encode(), self.token.encode())

    def new_session(self, now: float | None = None) -> str:
        """A fresh cookie value, its session remembered until :meth:`end_session`, its
        expiry, or :data:`MAX_SESSIONS` newer ones."""
        issued = int(time.time() if now is None else now)
        body = f"{issued}.{secrets.token_urlsafe(16)}"
        for old, at in list(self._live.items()):
            if issued - at > SESSION_SECONDS or len(self._live) >= MAX_SESSIONS:
                del self._live[old]
        self._live[body] = issued
        return f"{body}.{self._sign(body)}"

    def end_session(self, session: str) -> None:
        """Forget ``session`` (a :meth:`session` id): its cookie no longer works."""
        self._live.pop(session, None)

    def session(self, cookie: str | None, now: float | None = None) -> str | None:
        """The session id of a valid, unexpired cookie value of a session this process
        still remembers (``None`` otherwise)."""
        if self.token is None or not cookie or cookie.count(".") != 2:
            return None
        issued, nonce, signature = cookie.split(".")
        body = f"{issued}.{nonce}"
        if not hmac.compare_digest(signature.encode(), self._sign(body).encode()):
            return None
        try:
            age = (time.time() if now is None else now) - int(issued)
        except ValueError:
            return None
        return body if 0 <= age <= SESSION_SECONDS and body in self._live else None

    def csrf(self, session: str) -> str:
        """The CSRF token of ``session`` (forms carry it in a hidden field)."""
        return self._sign("csrf:" + session)

    def check(self, authorization: str | None, cookie: str | None, csrf: str | None) -> Verdict:
        """May a write with these credentials go ahead?

        Args:
            authorization: the ``Authorization`` header.
            cookie: the session cookie's value.
            csrf: the form's CSRF field (needed with the cookie, not with a bearer token).

        Returns:
            0 when it may; 401 when no credential was sent; 403 when one was sent and is
            wrong (or no token is configured, or the CSRF field is missing or wrong).
        """
        if authorization:
            scheme, _, value = authorization.partition(" ")
            if scheme.lower() != "bearer" or not self.token_matches(value.strip()):
                return Verdict(403, "wrong token")
            return Verdict(0)
        if not cookie:
            if self.token is None:
                return Verdict(403, "read-only: no token is configured")
            return Verdict(401, "log in, or send Authorization: Bearer <token>")
        session = self.session(cookie)
        if session is None:
            return Verdict(
                403, "the session is not valid (logged out, expired, or the dashboard restarted)"
            )
        if not csrf or not hmac.compare_digest(csrf.encode(), self.csrf(session).encode()):
            return Verdict(403, "the form's CSRF token is missing or wrong; reload the page")
        return Verdict(0)
