# SPDX-License-Identifier: MIT
"""A heartbeat retries a renewal lost to an outage and stops on a store error no retry
can cure (a closed store): it used to log a warning every beat for ever."""

from __future__ import annotations

import asyncio
import time

import pytest

from onceonly import _runtime
from onceonly.errors import StoreError, StoreUnavailable


@pytest.mark.parametrize(
    ("error", "beats_again"), [(StoreUnavailable("blip"), True), (StoreError("closed"), False)]
)
def test_a_renewal_error_is_retried_only_when_transient(
    error: Exception, beats_again: bool
) -> None:
    """Sync heartbeat on the shared scheduler."""
    calls: list[float] = []

    def beat() -> bool:
        calls.append(time.monotonic())
        raise error

    heartbeat = _runtime.Heartbeat(0.02, beat)
    heartbeat.start()
    try:
        time.sleep(0.3)
    finally:
        heartbeat.stop()
    assert (len(calls) > 1) is beats_again, calls


@pytest.mark.parametrize(
    ("error", "beats_again"), [(StoreUnavailable("blip"), True), (StoreError("closed"), False)]
)
def test_an_async_renewal_error_is_retried_only_when_transient(
    error: Exception, beats_again: bool
) -> None:
    """Async heartbeat in its task."""
    calls: list[float] = []

    async def beat() -> bool:
        calls.append(time.monotonic())
        raise error

    async def main() -> None:
        heartbeat = _runtime.AsyncHeartbeat(0.02, beat)
        heartbeat.start()
        await asyncio.sleep(0.3)
        await heartbeat.stop()

    asyncio.run(main())
    assert (len(calls) > 1) is beats_again, calls
