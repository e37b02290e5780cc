# SPDX-License-Identifier: MIT
"""``onceonly doctor``: checks of a deployment that break the guarantees quietly.

Each check returns :class:`Finding` objects saying what is wrong and what to do:

* the records table is missing or at an older schema version (run ``migrate()``);
* the database clock and this machine's differ (leases are on the database clock, but
  TTLs and deadlines chosen here are not);
* how PostgreSQL is reached: directly, through a pooler in session mode, or through
  transaction pooling (PgBouncer ``pool_mode=transaction``), where successive
  transactions of one connection run on different server backends. A transaction stays
  on one backend (atomic mode holds); the store then prepares nothing (a prepared
  statement would be missing or another client's in the next transaction) and the
  relay polls instead of ``LISTEN``. A store forced to prepare (``prepare=True``) there
  is a problem. Told apart with two connections (``behind_pooler`` and
  ``transaction_pooling`` in ``onceonly.stores.postgres._pool``);
* Redis evicts keys under memory pressure (``maxmemory-policy`` other than
  ``noeviction``): records or stream entries can vanish. For a Redis **store**,
  ``volatile-*`` passes with its cost stated (only completed records, which carry a TTL,
  can go, early: their duplicates run again); ``allkeys-*`` can evict a live claim;
* a Redis store without AOF forgets every completed key on a restart, and the clocks of
  Redis and this machine differ (leases are on Redis's clock);
* the consumers run more handlers at once than the store's pool has connections
  (atomic mode holds one connection per message: the rest wait, then time out);
* the inbox TTL is shorter than a NATS JetStream consumer's redelivery horizon
  (``max_deliver * ack_wait``) or its stream's ``max_age``: a late redelivery would run
  the handler again.

.. versionadded:: 0.2
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onceonly._core.pool import check_pool_size
from onceonly._core.urls import redact_url
from onceonly.types import AsyncStore, Store

if TYPE_CHECKING:
    from onceonly.stores.postgres import PostgresStore

__all__ = ["Finding", "check_nats", "check_pool", "check_redis", "check_redis_store", "check_store"]

SKEW_LIMIT = 2.0  # seconds


@dataclass(frozen=True)
class Finding:
    """One problem: ``what`` is wrong, ``fix`` says what to do; ``ok`` lines are checks
    that passed (printed, not counted)."""

    check: str
    what: str
    fix: str = ""
    ok: bool = False


def _pass(check: str, what: str) -> Finding:
    return Finding(check, what, ok=True)


def check_store(store: Store) -> list[Finding]:
    """Schema version, clock skew and connection pooling of a sync store."""
    out: list[Finding] = []
    expected = store.latest_schema_version
    if expected is not None:
        found = store.schema_version()
        if found is None:
            out.append(
                Finding(
                    "schema",
                    f"the records table of {redact_url(store.url)} is not migrated",
                    "run store.migrate() (or deploy a migration) before consumers start",
                )
            )
        elif found < expected:
            out.append(
                Finding(
                    "schema",
                    f"the records table is at schema version {found}; this onceonly needs"
                    f" {expected}",
                    "run store.migrate() with this version (safe to repeat, concurrent-safe)",
                )
            )
        else:
            out.append(_pass("schema", f"schema version {found}"))
    if store.dialect == "postgresql":
        from onceonly.stores.postgres import PostgresStore

        if isinstance(store, PostgresStore):
            out += _check_postgres(store)
    elif store.dialect == "redis":
        from onceonly.stores.redis import RedisStore

        if isinstance(store, RedisStore):
            out += check_redis_store(store.client)
    return out


def check_redis_store(client: Any) -> list[Finding]:
    """Eviction policy, persistence and clock skew of the Redis under a Redis store.

    .. versionadded:: 0.3
    """
    out: list[Finding] = []
    config = client.config_get("maxmemory-policy")
    policy = _text(config.get("maxmemory-policy") or config.get(b"maxmemory-policy", ""))
    if policy == "noeviction":
        out.append(_pass("redis-eviction", "maxmemory-policy noeviction"))
    elif policy.startswith("volatile-"):
        out.append(
            _pass(
                "redis-eviction",
                f"maxmemory-policy {policy}: live claims are never evicted; completed records"
                " (they carry a TTL) may be, early, and their duplicates then run again",
            )
        )
    else:
        out.append(
            Finding(
                "redis-eviction",
                f"Redis maxmemory-policy is {policy!r}: under memory pressure it may evict a"
                " live claim (a concurrent duplicate then runs too) or a completed record",
                "set maxmemory-policy noeviction (writes then fail loudly), or volatile-lru",
            )
        )
    aof = client.config_get("appendonly")
    if _text(aof.get("appendonly") or aof.get(b"appendonly", "")) != "yes":
        out.append(
            Finding(
                "redis-durability",
                "Redis runs without AOF (appendonly no): a restart or crash forgets the"
                " completed keys written since the last snapshot, and their duplicates run"
                " again",
                "set appendonly yes (appendfsync everysec loses up to about 1 s; always"
                " loses nothing acknowledged)",
            )
        )
    else:
        out.append(_pass("redis-durability", "appendonly yes"))
    before = time.time()
    secs, micros = client.time()
    after = time.time()
    skew = secs + micros / 1e6 - (before + after) / 2
    if abs(skew) > SKEW_LIMIT + (after - before) / 2:
        out.append(
            Finding(
                "clock",
                f"the Redis clock is {skew:+.1f} s from this machine's",
                "run NTP (chrony) on both; leases use Redis's clock, but TTLs, waits and"
                " broker deadlines are measured here",
            )
        )
    else:
        out.append(_pass("clock", f"clock skew {skew:+.3f} s"))
    return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _check_postgres(store: PostgresStore) -> list[Finding]:
    from onceonly.stores.postgres._pool import behind_pooler, transaction_pooling

    out: list[Finding] = []
    with store._connection(autocommit=True) as conn:
        before = time.time()
        row = conn.execute("SELECT date_part('epoch', clock_timestamp())").fetchone()
        after = time.time()
        assert row is not None  # a SELECT without FROM returns one row
        skew = float(row[0]) - (before + after) / 2
        if abs(skew) > SKEW_LIMIT + (after - before) / 2:
            out.append(
                Finding(
                    "clock",
                    f"the database clock is {skew:+.1f} s from this machine's",
                    "run NTP (chrony) on both; leases use the database clock, but TTLs,"
                    " waits and broker deadlines are measured here",
                )
            )
        else:
            out.append(_pass("clock", f"clock skew {skew:+.3f} s"))
        pooled = behind_pooler(conn)
        if pooled:
            with store._connection(autocommit=True) as other:
                per_transaction = transaction_pooling(conn, other)
    if not pooled:
        out.append(_pass("pooling", "a direct connection to PostgreSQL (no pooler)"))
    elif not per_transaction:
        out.append(
            _pass(
                "pooling",
                "a connection pooler in session mode (each client connection keeps its"
                " server connection): LISTEN works; the store prepares nothing unless"
                " prepare=True, which is safe here",
            )
        )
    elif store.prepare:
        out.append(
            Finding(
                "pooling",
                "transaction pooling (PgBouncer pool_mode=transaction: each transaction on"
                " any server connection) and the store prepares statements (prepare=True):"
                " they fail, or run another client's statement, in the next transaction",
                "drop prepare=True (the default prepares nothing behind a pooler), or run"
                " PgBouncer >= 1.21 with max_prepared_statements",
            )
        )
    else:
        out.append(
            _pass(
                "pooling",
                "transaction pooling (PgBouncer pool_mode=transaction: each transaction on"
                " any server connection): the store prepares nothing and the outbox relay"
                " polls instead of LISTEN; a connection you hand the store needs"
                " prepare_threshold=None",
            )
        )
    return out


def check_pool(
    store: Store | AsyncStore, concurrency: int, pool_size: int | None = None
) -> list[Finding]:
    """Whether the store's pool (``pool_size``, default: the store's own
    ``store.pool_size``) has a connection for each of ``concurrency`` handlers running
    at once (:func:`onceonly._core.pool.check_pool_size`)."""
    found = check_pool_size(concurrency, store.pool_size if pool_size is None else pool_size)
    return [Finding("pool", found.what, found.fix, ok=found.ok)]


def check_redis(url: str) -> list[Finding]:
    """Whether Redis at ``url`` may evict keys."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        policy = str(client.config_get("maxmemory-policy").get("maxmemory-policy", ""))
    finally:
        client.close()
    if policy != "noeviction":
        return [
            Finding(
                "redis",
                f"Redis maxmemory-policy is {policy!r}: under memory pressure it evicts"
                " keys, and an evicted record or stream entry is a lost dedup or message",
                "set maxmemory-policy noeviction (writes then fail loudly instead)",
            )
        ]
    return [_pass("redis", "maxmemory-policy noeviction")]


def check_nats(url: str, stream: str, consumer: str | None, ttl: float | None) -> list[Finding]:
    """Whether an inbox ``ttl`` covers a JetStream consumer's redelivery horizon."""
    return asyncio.run(_check_nats(url, stream, consumer, ttl))


async def _check_nats(
    url: str, stream: str, consumer: str | None, ttl: float | None
) -> list[Finding]:
    import nats

    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        horizons: list[tuple[str, float]] = []
        if info.config.max_age:
            horizons.append((f"stream {stream} max_age", float(info.config.max_age)))
        if consumer is not None:
            c = await js.consumer_info(stream, consumer)
            deliveries, ack_wait = c.config.max_deliver, c.config.ack_wait
            if deliveries is None or deliveries < 0:
                horizons.append((f"consumer {consumer} max_deliver (unlimited)", float("inf")))
            elif ack_wait:
                horizons.append(
                    (f"consumer {consumer} max_deliver * ack_wait", deliveries * float(ack_wait))
                )
    finally:
        await nc.close()
    if ttl is None:
        return [_pass("nats", "the inbox ttl is unlimited")]
    out = []
    for name, horizon in horizons:
        if ttl < horizon:
            shown = "unlimited" if horizon == float("inf") else f"{horizon:.0f} s"
            out.append(
                Finding(
                    "nats",
                    f"the inbox ttl ({ttl:.0f} s) is shorter than the {name} ({shown}):"
                    " a redelivery after the ttl runs the handler again",
                    "raise the inbox ttl above the horizon, or bound max_deliver / max_age",
                )
            )
    return out or [_pass("nats", "the inbox ttl covers the redelivery horizon")]


def broker_scheme(url: str) -> str:
    """The scheme of a broker URL, lower case."""
    return urllib.parse.urlsplit(url).scheme.lower()
