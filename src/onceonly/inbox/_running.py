# SPDX-License-Identifier: MIT
"""Which store's atomic transaction the running handler is inside (docs/modes.md).

A leased call (``@idempotent``) commits its record on a connection of its own. Made from
inside an atomic handler on the **same** store, it needs a second connection while the
handler holds one: SQLite's single writer waits for its own transaction, and a pool
whose every connection is held by a handler waits for itself until the pool timeout, an
outage the consumers retry for ever. Such a call is refused at once instead.

"The same store" is decided by the stores' ``connection_source`` (the store contract,
:mod:`onceonly.types`): a second ``open_store()`` on the same SQLite file, or a
``TieredStore`` over the handler's store, is the same store here.
"""

from __future__ import annotations

import contextvars

from onceonly.errors import ConfigurationError
from onceonly.types import AsyncStore, Store

__all__ = ["inside_atomic_handler", "refuse_nested"]

_store: contextvars.ContextVar[Store | AsyncStore | None] = contextvars.ContextVar(
    "onceonly_atomic_handler_store", default=None
)


def inside_atomic_handler(store: Store | AsyncStore) -> _Inside:
    """Mark the handler run in this context as inside ``store``'s atomic transaction."""
    return _Inside(store)


class _Inside:
    """:func:`inside_atomic_handler`: a class rather than a generator context manager, as
    it is entered once per message."""

    __slots__ = ("_reset", "_store")

    def __init__(self, store: Store | AsyncStore) -> None:
        self._store = store

    def __enter__(self) -> None:
        self._reset = _store.set(self._store)

    def __exit__(self, *exc: object) -> None:
        _store.reset(self._reset)


def refuse_nested(store: Store | AsyncStore, what: str) -> None:
    """Raise if this context runs an atomic handler on ``store`` (see the module doc).

    Raises:
        ConfigurationError: ``what`` is a leased call on the store of the atomic
            handler it runs in.
    """
    running = _store.get()
    if running is not None and (
        running is store or running.connection_source == store.connection_source
    ):
        raise ConfigurationError(
            f"{what} runs inside an atomic handler on the same store: its record would "
            "need a second connection of that store while the handler holds one, which "
            "deadlocks (SQLite's single writer, or a pool whose connections handlers "
            "hold). Publish the effect with tx.publish() and run it in its own consumer, "
            "or give the decorator a store of its own (another open_store(url))"
        )
