# SPDX-License-Identifier: MIT
"""Errors of the outbox's own statements (the relay's and ``Outbox``'s), translated.

The stores translate the errors of their record statements; the outbox runs its
statements through ``session.execute``, whose errors are the driver's own. The store
translates them with its one table (``store.translate(exc)``, the store contract): a
missing table becomes :class:`~onceonly.NotMigrated`, transient failures (and a write
lock the database did not grant in time) :class:`~onceonly.StoreUnavailable`, the rest
:class:`~onceonly.StoreError`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from onceonly.errors import InFlight, StoreError, StoreUnavailable
from onceonly.types import AsyncStore, Store

__all__ = ["store_errors"]


@contextlib.contextmanager
def store_errors(store: Store | AsyncStore) -> Iterator[None]:
    """Translate driver errors of the outbox's own statements on ``store``."""
    try:
        yield
    except StoreError:
        raise
    except InFlight as exc:  # a writer held the lock past the lock wait
        raise StoreUnavailable(f"the outbox database is busy: {exc}") from exc
    except Exception as exc:
        error = store.translate(exc)
        if error is None:
            raise
        if isinstance(error, InFlight):  # a lock wait ran out: the database is busy
            raise StoreUnavailable(f"the outbox database is busy: {error}") from exc
        raise error from exc
