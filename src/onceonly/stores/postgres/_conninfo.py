# SPDX-License-Identifier: MIT
"""PostgreSQL connection strings (no I/O): URL forms, timeouts, what to print, locality.

Shared by the async store and its generated sync twin.
"""

from __future__ import annotations

import math
import os
import re

import psycopg
from psycopg.conninfo import conninfo_to_dict

from onceonly.errors import ConfigurationError

__all__ = [
    "_conninfo",
    "_describe",
    "_is_local",
    "_libpq_seconds",
    "_tcp_defaults",
    "check_conninfo",
]

# TCP keepalives of the store's connections: an idle one to a dead host is found in
# about idle + interval * count seconds (instead of the kernel's two hours)
_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}


def _tcp_defaults(url: str, read_timeout: float | None) -> dict[str, int]:
    """libpq TCP settings for the store's connections, where ``url`` sets none of its own:
    keepalives, and ``tcp_user_timeout`` (data unacknowledged this long: the connection
    is dead; Linux) at ``read_timeout``."""
    try:
        given = conninfo_to_dict(_conninfo(url))
    except psycopg.Error:
        given = {}
    defaults = dict(_KEEPALIVES)
    if read_timeout is not None:
        defaults["tcp_user_timeout"] = max(1, round(read_timeout * 1000))
    return {name: value for name, value in defaults.items() if name not in given}


def _conninfo(url: str) -> str:
    """Accept SQLAlchemy-style ``postgresql+psycopg://`` URLs as well as libpq ones."""
    return re.sub(r"^(postgres(?:ql)?)\+\w+://", r"\1://", url)


def check_conninfo(url: str) -> None:
    """Refuse a URL or conninfo libpq cannot use, before any connection is tried.

    libpq parses the options (an unknown or misspelt one is refused); the ports are
    checked here, as libpq reports an impossible one only when it connects (which would
    read as a server that cannot be reached).

    Raises:
        ConfigurationError: an unknown option, a malformed URL or an impossible port.
    """
    try:
        params = conninfo_to_dict(_conninfo(url))
    except psycopg.Error as exc:
        raise ConfigurationError(f"bad PostgreSQL URL or conninfo: {exc}") from None
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ConfigurationError(f"bad port {port!r} in the PostgreSQL URL or conninfo")


def _libpq_seconds(seconds: float) -> int:
    """``seconds`` as libpq's ``connect_timeout`` (whole seconds; it treats 1 as 2)."""
    return max(2, math.ceil(seconds))


def _describe(conninfo: str) -> str:
    """host, port, database and user of ``conninfo``, never its password."""
    try:
        params = conninfo_to_dict(_conninfo(conninfo))
    except psycopg.Error:
        return "an unparsable conninfo"
    host = params.get("host") or params.get("hostaddr") or os.environ.get("PGHOST") or "local"
    port = params.get("port") or os.environ.get("PGPORT") or "5432"
    db = params.get("dbname") or os.environ.get("PGDATABASE") or params.get("user") or "?"
    user = params.get("user") or os.environ.get("PGUSER") or "?"
    return f"host {host}, port {port}, database {db}, user {user}"


def _is_local(conninfo: str) -> bool:
    """Whether every host of ``conninfo`` is a Unix socket or a loopback address."""
    try:
        params = conninfo_to_dict(_conninfo(conninfo))
    except psycopg.Error:
        return False
    hosts = str(params.get("hostaddr") or params.get("host") or os.environ.get("PGHOST", ""))
    return all(
        not host or host.startswith(("/", "@", "127.")) or host in ("localhost", "::1")
        for host in hosts.split(",")
    )
