# SPDX-License-Identifier: MIT
"""Which publish failures count against a row (pure: no I/O).

A relay counts a failed publish towards ``max_attempts`` only when the broker refused
*the message* (permanent: unroutable, too large, nacked). A failure to reach the broker
(refused or lost connection, a timeout) says nothing about the message: the row is
postponed with backoff and keeps its attempts, so a broker outage of any length never
makes rows dead.

======================================  =============
exception                               kind
======================================  =============
``BrokerUnavailable``                   transient
other ``PublishError``                  permanent
``ConnectionError``, ``OSError``,       transient
any ``TimeoutError``
anything else                           permanent (a bug in a publisher must end somewhere)
======================================  =============
"""

from __future__ import annotations

from onceonly.errors import BrokerUnavailable, PublishError

__all__ = ["is_transient"]


def is_transient(exc: BaseException) -> bool:
    """Whether a publish failure says the broker was unreachable rather than the message
    refused (the module table)."""
    if isinstance(exc, BrokerUnavailable):
        return True
    if isinstance(exc, PublishError):
        return False
    if isinstance(exc, (ConnectionError, OSError)):
        return True
    # asyncio.TimeoutError is not the builtin TimeoutError before Python 3.11
    return any(cls.__name__ == "TimeoutError" for cls in type(exc).__mro__)
