# SPDX-License-Identifier: MIT
"""Redis store URLs (no I/O): a single server, a Cluster, or a master found by Sentinel.

* ``redis://[[user]:password@]host:6379/0``, ``rediss://…`` (TLS): one server (redis-py's
  ``from_url`` reads the rest, query options included);
* ``redis+cluster://host:7000`` / ``rediss+cluster://…``: a Redis Cluster, found from
  that startup node (every record is one key, so each operation runs on its node);
* ``redis+sentinel://[:password@]host:26379[,host:26379…]/service[/db]`` /
  ``rediss+sentinel://…``: the current master of ``service``, asked of the sentinels
  (the password is the master's; the sentinels are asked without one).
"""

from __future__ import annotations

import functools
import inspect
import urllib.parse
from dataclasses import dataclass

from onceonly.errors import ConfigurationError

__all__ = ["SCHEMES", "RedisTarget", "parse"]

SCHEMES = (
    "redis",
    "rediss",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
)


@dataclass(frozen=True)
class RedisTarget:
    """What a Redis store URL names."""

    kind: str  # "server", "cluster" or "sentinel"
    url: str = ""  # for "server" and "cluster": a redis:// or rediss:// URL for from_url
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    password: str | None = None
    username: str | None = None
    ssl: bool = False


@functools.lru_cache(maxsize=1)
def _query_options() -> frozenset[str]:
    """The query options redis-py's ``from_url`` can pass on to a connection."""
    import redis.connection as rc

    names = set(rc.URL_QUERY_ARGUMENT_PARSERS)
    for cls in (rc.AbstractConnection, rc.Connection, rc.SSLConnection, rc.ConnectionPool):
        names.update(inspect.signature(cls.__init__).parameters)
    return frozenset(names - {"self", "kwargs", "connection_kwargs"})


def _check_query(url: str) -> None:
    """Refuse a query option redis-py would fail on only when it first connects."""
    query = urllib.parse.urlsplit(url).query
    unknown = sorted(
        {name for name, _ in urllib.parse.parse_qsl(query, keep_blank_values=True)}
        - _query_options()
    )
    if unknown:
        raise ConfigurationError(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} in the "
            "Redis URL (the store's own options, such as prefix=, are keyword arguments of "
            "open_store; the URL takes redis-py's, e.g. socket_timeout, health_check_interval)"
        )


def parse(url: str) -> RedisTarget:
    """The target of a Redis store ``url``.

    Raises:
        ConfigurationError: an unknown scheme or query option, or a Sentinel URL without
            hosts or service.
    """
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in SCHEMES:
        raise ConfigurationError(f"not a Redis store URL: {url!r} (schemes: {', '.join(SCHEMES)})")
    base = scheme.split("+")[0]
    _check_query(url)
    if scheme in ("redis", "rediss"):
        return RedisTarget("server", url)
    if scheme.endswith("+cluster"):
        return RedisTarget("cluster", f"{base}://{rest}")
    parts = urllib.parse.urlsplit(f"{base}://{rest}")
    netloc = parts.netloc
    userinfo, _, hosts = netloc.rpartition("@")
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    sentinels = []
    for host in filter(None, hosts.split(",")):
        name, _, port = host.rpartition(":") if ":" in host else (host, "", "26379")
        try:
            sentinels.append((name or "localhost", int(port)))
        except ValueError:
            raise ConfigurationError(f"bad sentinel address {host!r} in {url!r}") from None
    path = [p for p in parts.path.split("/") if p]
    if not sentinels or not path:
        raise ConfigurationError(
            f"a Sentinel URL names its sentinels and the service: "
            f"redis+sentinel://host:26379[,host:26379]/service[/db], not {url!r}"
        )
    try:
        db = int(path[1]) if len(path) > 1 else 0
    except ValueError:
        raise ConfigurationError(f"bad database number {path[1]!r} in {url!r}") from None
    return RedisTarget(
        "sentinel",
        sentinels=tuple(sentinels),
        service=urllib.parse.unquote(path[0]),
        db=db,
        password=urllib.parse.unquote(password) if password else None,
        username=urllib.parse.unquote(username) if username else None,
        ssl=base == "rediss",
    )
