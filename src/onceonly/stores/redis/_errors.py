# SPDX-License-Identifier: MIT
"""The one place redis-py errors become onceonly errors (shared by the Redis store's sync
and async modules and by the Redis cache tier; no I/O)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

try:
    from redis import exceptions as rexc
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the Redis store needs the redis extra: pip install 'onceonly[redis]'"
    ) from exc

from onceonly.errors import OnceOnlyError, StoreError, StoreUnavailable

__all__ = ["redis_errors", "translate"]

#: Error replies that say Redis cannot serve right now (loading, a read-only replica
#: after a failover, out of memory, busy, cluster resharding): transient.
_TRANSIENT_REPLIES = ("LOADING", "OOM", "READONLY", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN")


def translate(
    exc: BaseException, scope: str | None = None, key: str | None = None
) -> OnceOnlyError | None:
    """The onceonly error for a redis-py error (``None``: ``exc`` is not one): transient
    ones :class:`StoreUnavailable`, the others :class:`StoreError`."""
    if isinstance(exc, (rexc.ConnectionError, rexc.TimeoutError)):
        return StoreUnavailable(f"Redis is unreachable: {exc}", scope=scope, key=key)
    if isinstance(exc, rexc.ResponseError):
        if str(exc).split(" ", 1)[0].upper() in _TRANSIENT_REPLIES:
            return StoreUnavailable(f"Redis cannot serve now: {exc}", scope=scope, key=key)
        return StoreError(f"Redis refused the operation: {exc}", scope=scope, key=key)
    if isinstance(exc, rexc.RedisError):
        return StoreError(f"Redis failed: {exc}", scope=scope, key=key)
    return None


@contextmanager
def redis_errors(scope: str | None = None, key: str | None = None) -> Iterator[None]:
    """Translate redis-py's errors raised inside (:func:`translate`)."""
    try:
        yield
    except rexc.RedisError as exc:
        error = translate(exc, scope, key)
        assert error is not None  # every RedisError has a translation
        raise error from exc
