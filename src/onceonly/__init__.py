# SPDX-License-Identifier: MIT
"""onceonly: make at-least-once consumers and retried requests produce their effects once.

Atomic mode (``Inbox``): the claim, the handler's database writes and the completion
commit in one transaction. Leased mode (``idempotent``): a fenced, renewed lease for
effects outside the database. See docs/spec.md for the precise guarantees.
"""

import logging as _logging

from onceonly.admin import Admin
from onceonly.admin_async import AsyncAdmin
from onceonly.decorator import idempotent
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
from onceonly.inbox import Inbox, Tx
from onceonly.inbox_async import AsyncInbox, AsyncTx
from onceonly.inbox_batch import BatchItem
from onceonly.keys import composite_key, content_key, time_window_key, uuid7, validate_key
from onceonly.leased import Claim, LeasedRunner, Replay, current_claim
from onceonly.leased_async import AsyncClaim, AsyncLeasedRunner, current_async_claim
from onceonly.messaging import AsyncPublisher, Delivery, OutboxMessage, Publisher
from onceonly.open import open_async_store, open_store
from onceonly.outbox import Outbox
from onceonly.outbox_async import AsyncOutbox
from onceonly.outcome import Outcome
from onceonly.relay import Relay, RelayStats
from onceonly.relay_async import AsyncRelay

__version__ = "0.1.0"

_logging.getLogger("onceonly").addHandler(_logging.NullHandler())

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
