# SPDX-License-Identifier: MIT
"""URLs safe to print: passwords and other secrets replaced by ``***`` (pure, no I/O).

Every URL the CLI or a log line shows goes through :func:`redact_url`: store URLs
(``postgresql://``, ``mysql://``, ``redis://``), broker URLs (``amqp://``, ``nats://``)
and libpq conninfo strings (``host=… password=…``). It never raises: a URL it cannot
parse is shown as a placeholder rather than risk printing a secret.
"""

from __future__ import annotations

import re
import urllib.parse

__all__ = ["redact_url"]

MASK = "***"
# query parameters whose values are secrets, compared case-insensitively
_SECRET_PARAMS = frozenset(
    {
        "password",
        "passwd",
        "pass",
        "pwd",
        "secret",
        "sslpassword",
        "token",
        "auth_token",
        "access_token",
        "api_key",
        "apikey",
        "nkey",
        "seed",
    }
)
_CONNINFO_SECRET = re.compile(
    r"(?P<name>\b(?:password|sslpassword)\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'|\S+)",
    re.IGNORECASE,
)


def redact_url(url: object) -> str:
    """``url`` with its password and secret query parameters replaced by ``***``.

    Args:
        url: a URL (``scheme://user:password@host/…?password=…``) or a libpq conninfo
            string; anything else is shown by its type only.

    Returns:
        The text to print.
    """
    if not isinstance(url, str):
        return f"<{type(url).__name__}>"
    try:
        if "://" not in url:
            return _CONNINFO_SECRET.sub(lambda m: m.group("name") + MASK, url)
        parts = urllib.parse.urlsplit(url)
        netloc = parts.netloc
        userinfo, at, hosts = netloc.rpartition("@")
        if at:
            user, colon, _password = userinfo.partition(":")
            if colon:
                netloc = f"{user}:{MASK}@{hosts}"
            elif user and parts.scheme.lower().startswith("redis") and not hosts.startswith("["):
                # redis://secret@host: a lone userinfo is the password (AUTH without a user)
                netloc = f"{MASK}@{hosts}"
        query = parts.query
        if query:
            pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
            if any(k.lower() in _SECRET_PARAMS for k, _ in pairs):
                query = urllib.parse.urlencode(
                    [(k, MASK if k.lower() in _SECRET_PARAMS else v) for k, v in pairs],
                    safe="*/:",
                )
        if netloc == parts.netloc and query == parts.query:
            return url  # nothing secret (urlunsplit would drop sqlite:////'s empty host)
        return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except (ValueError, TypeError):
        return "<a URL that could not be parsed>"
