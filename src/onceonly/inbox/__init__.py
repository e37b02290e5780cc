# SPDX-License-Identifier: MIT
"""Exactly-once effects for one message or call: both modes, their transactions and outcomes.

Atomic mode (``Inbox``/``AsyncInbox``): the claim, the handler's writes through ``Tx`` and
the completion commit in one transaction. Leased mode (``LeasedRunner``, ``@idempotent``):
a fenced, renewed lease held in a ``Claim`` for effects outside the database.
"""

from __future__ import annotations

from onceonly.inbox._atomic import Inbox, Tx
from onceonly.inbox._atomic_async import AsyncInbox, AsyncTx
from onceonly.inbox._decorator import idempotent
from onceonly.inbox._leased import Claim, LeasedRunner, current_claim
from onceonly.inbox._leased_async import AsyncClaim, AsyncLeasedRunner, current_async_claim
from onceonly.inbox._leased_inbox import LeasedTx
from onceonly.inbox._leased_inbox_async import AsyncLeasedTx
from onceonly.inbox._outcome import BatchItem, BatchMessage, Outcome, Replay

__all__ = [
    "AsyncClaim",
    "AsyncInbox",
    "AsyncLeasedRunner",
    "AsyncLeasedTx",
    "AsyncTx",
    "BatchItem",
    "BatchMessage",
    "Claim",
    "Inbox",
    "LeasedRunner",
    "LeasedTx",
    "Outcome",
    "Replay",
    "Tx",
    "current_async_claim",
    "current_claim",
    "idempotent",
]
