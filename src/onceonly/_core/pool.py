# SPDX-License-Identifier: MIT
"""Whether a store's pool has a connection for each handler that runs at once (no I/O).

In atomic mode each handler (or batch) holds one store connection for its whole run:
more of them than the pool has connections wait for one, and can time out. Both
``onceonly doctor`` and a consumer at start-up ask this.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PoolCheck", "check_pool_size"]


@dataclass(frozen=True)
class PoolCheck:
    """The answer: ``ok``, what was found, and (when not ok) what to do."""

    ok: bool
    what: str
    fix: str = ""


def check_pool_size(concurrency: int, pool_size: int | None) -> PoolCheck:
    """Whether a pool of ``pool_size`` connections (``None``: the store has no pool of its
    own) serves ``concurrency`` handlers running at once."""
    if pool_size is None:
        return PoolCheck(True, "the store has no connection pool (one connection per use)")
    if concurrency > pool_size:
        return PoolCheck(
            False,
            f"consumers run {concurrency} handlers at once but the store's pool has"
            f" {pool_size} connections: in atomic mode each message holds one, so the"
            " rest wait for a connection and can time out",
            f"raise the pool's max_size to at least {concurrency}, or lower the"
            " consumers' concurrency",
        )
    return PoolCheck(True, f"pool of {pool_size} for {concurrency} concurrent handlers")
