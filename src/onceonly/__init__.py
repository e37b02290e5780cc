# SPDX-License-Identifier: MIT
"""onceonly: make at-least-once consumers and retried requests produce their effects once.

Atomic mode (``Inbox``): the claim, the handler's database writes and the completion
commit in one transaction. Leased mode (``idempotent``): a fenced, renewed lease for
effects outside the database. See docs/spec.md for the precise guarantees.
"""

import importlib as _importlib
import importlib.abc as _abc
import importlib.machinery as _machinery
import importlib.util as _util
import logging as _logging
import sys as _sys
import types as _types
import warnings as _warnings

from onceonly.admin import Admin, AsyncAdmin
from onceonly.errors import (
    BrokerUnavailable,
    ConfigurationError,
    CorruptRecord,
    DeadLettered,
    EncodingError,
    InFlight,
    InvalidKey,
    InvalidPayload,
    InvalidPrincipal,
    LeaseLost,
    MissingMessageId,
    NotMigrated,
    OnceOnlyError,
    OutcomeNotRecorded,
    PayloadMismatch,
    PublishError,
    ReplayedError,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
    TooLarge,
    TransactionAborted,
    TransactionEnded,
    TransactionError,
    UnsupportedEngine,
)
from onceonly.inbox import (
    AsyncClaim,
    AsyncInbox,
    AsyncLeasedRunner,
    AsyncTx,
    BatchItem,
    BatchMessage,
    Claim,
    Inbox,
    LeasedRunner,
    Outcome,
    Replay,
    Tx,
    current_async_claim,
    current_claim,
    idempotent,
)
from onceonly.keys import composite_key, content_key, time_window_key, uuid7, validate_key
from onceonly.messaging import AsyncPublisher, Delivery, OutboxMessage, Publisher
from onceonly.outbox import AsyncOutbox, AsyncRelay, Outbox, Relay, RelayStats
from onceonly.stores import open_async_store, open_store

__version__ = "0.1.0"

_logging.getLogger("onceonly").addHandler(_logging.NullHandler())


# Modules that moved into packages: the old import paths still work and warn once.
_MOVED = {
    "onceonly.admin_async": "onceonly.admin",
    "onceonly.decorator": "onceonly.inbox",
    "onceonly.inbox_async": "onceonly.inbox",
    "onceonly.inbox_batch": "onceonly.inbox",
    "onceonly.inbox_batch_async": "onceonly.inbox",
    "onceonly.leased": "onceonly.inbox",
    "onceonly.leased_async": "onceonly.inbox",
    "onceonly.http.principals": "onceonly.http",
    "onceonly.open": "onceonly.stores",
    "onceonly.outbox_async": "onceonly.outbox",
    "onceonly.outcome": "onceonly.inbox",
    "onceonly.relay": "onceonly.outbox",
    "onceonly.relay_async": "onceonly.outbox",
    "onceonly.stores.engine_pool": "onceonly.stores",
    "onceonly.stores.engine_pool_async": "onceonly.stores",
    "onceonly.stores.mysql_async": "onceonly.stores.mysql",
    "onceonly.stores.mysql_engine": "onceonly.stores.mysql",
    "onceonly.stores.mysql_engine_async": "onceonly.stores.mysql",
    "onceonly.stores.postgres_async": "onceonly.stores.postgres",
    "onceonly.stores.postgres_partitions": "onceonly.stores.postgres",
    "onceonly.stores.postgres_partitions_async": "onceonly.stores.postgres",
    "onceonly.stores.postgres_psycopg2_engine": "onceonly.stores.postgres",
    "onceonly.stores.redis_store": "onceonly.stores.redis",
    "onceonly.stores.redis_store_async": "onceonly.stores.redis",
    "onceonly.stores.sqlite_engine": "onceonly.stores.sqlite",
    "onceonly.stores.threaded": "onceonly.stores",
    "onceonly.stores.tiered_async": "onceonly.stores.tiered",
    "onceonly.tx": "onceonly.inbox",
    "onceonly.tx_async": "onceonly.inbox",
}


class _MovedModule(_abc.MetaPathFinder, _abc.Loader):
    """Imports a moved module under its old name, with a warning: a module of its own
    (the package face keeps its name and spec) holding the face's public names."""

    def find_spec(
        self, fullname: str, path: object, target: object = None
    ) -> _machinery.ModuleSpec | None:
        return _util.spec_from_loader(fullname, self) if fullname in _MOVED else None

    def create_module(self, spec: _machinery.ModuleSpec) -> _types.ModuleType:
        face = _importlib.import_module(_MOVED[spec.name])
        _warnings.warn(
            f"{spec.name} moved: import from {face.__name__} instead",
            DeprecationWarning,
            stacklevel=_caller_level(),
        )
        alias = _types.ModuleType(spec.name, face.__doc__)
        names = list(getattr(face, "__all__", ()))
        alias.__dict__.update({name: getattr(face, name) for name in names})
        alias.__all__ = names  # type: ignore[attr-defined]
        return alias

    def exec_module(self, module: _types.ModuleType) -> None:
        pass


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside the import machinery, so the
    warning names the user's line also for ``importlib.import_module(old)``.

    ``warnings`` already skips the frames of ``importlib._bootstrap``; the frames of
    ``importlib/__init__.py`` (``import_module``) it counts, so they are added here.
    """
    level, walk = 2, _sys._getframe(2)  # 2: the caller of create_module
    frame: _types.FrameType | None = walk
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if "importlib" in name and "_bootstrap" in name:
            pass  # skipped by warnings itself
        elif name.endswith("importlib/__init__.py"):
            level += 1
        else:
            break
        frame = frame.f_back
    return level


_sys.meta_path.append(_MovedModule())

__all__ = [
    "Admin",
    "AsyncAdmin",
    "AsyncClaim",
    "AsyncInbox",
    "AsyncLeasedRunner",
    "AsyncOutbox",
    "AsyncPublisher",
    "AsyncRelay",
    "AsyncTx",
    "BatchItem",
    "BatchMessage",
    "BrokerUnavailable",
    "Claim",
    "ConfigurationError",
    "CorruptRecord",
    "DeadLettered",
    "Delivery",
    "EncodingError",
    "InFlight",
    "Inbox",
    "InvalidKey",
    "InvalidPayload",
    "InvalidPrincipal",
    "LeaseLost",
    "LeasedRunner",
    "MissingMessageId",
    "NotMigrated",
    "OnceOnlyError",
    "Outbox",
    "OutboxMessage",
    "Outcome",
    "OutcomeNotRecorded",
    "PayloadMismatch",
    "PublishError",
    "Publisher",
    "Relay",
    "RelayStats",
    "Replay",
    "ReplayedError",
    "StoreError",
    "StoreMisconfigured",
    "StoreUnavailable",
    "TooLarge",
    "TransactionAborted",
    "TransactionEnded",
    "TransactionError",
    "Tx",
    "UnsupportedEngine",
    "composite_key",
    "content_key",
    "current_async_claim",
    "current_claim",
    "idempotent",
    "open_async_store",
    "open_store",
    "time_window_key",
    "uuid7",
    "validate_key",
]
