# SPDX-License-Identifier: MIT
"""The leases of deliveries in flight, for a consumer on a leased inbox (spec §1.4a,
§4.6): the loop's extension step renews each held lease and extends the broker's
deadline only of the deliveries whose lease is still theirs.

The inbox's own heartbeat renews every ``lease / 3`` as well; renewing here too, just
before the broker's deadline moves, is what keeps the two together: a delivery is kept
from the broker only while its claim is held, and one taken over is let go (its run
ends in ``LeaseLost``, which hands it back, never acks it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from onceonly.brokers._transport import Incoming
from onceonly.inbox import AsyncClaim, AsyncInbox

__all__ = ["Leases"]


class Leases:
    """The claim held by each delivery in flight (keyed by the delivery's identity)."""

    def __init__(self, inbox: AsyncInbox, log: logging.Logger) -> None:
        self.inbox = inbox
        self.log = log
        self._claims: dict[int, AsyncClaim] = {}

    def holder(self, d: Incoming) -> Callable[[AsyncClaim], None]:
        """What the handler wrapper calls with ``d``'s claim when a leased run starts."""

        def held(claim: AsyncClaim) -> None:
            self._claims[id(d)] = claim

        return held

    def drop(self, d: Incoming) -> None:
        """``d`` is settled: forget its claim."""
        self._claims.pop(id(d), None)

    async def still_held(self, ds: Sequence[Incoming]) -> list[Incoming]:
        """``ds`` less the deliveries whose claim was taken over, each held lease renewed
        now. A renewal that fails on a store error keeps its delivery (not known lost)."""
        leased = [(d, c) for d in ds if (c := self._claims.get(id(d))) is not None]
        held = await asyncio.gather(*(c.renew() for _, c in leased), return_exceptions=True)
        lost: set[int] = set()
        for (d, _), ok in zip(leased, held, strict=True):
            if ok is False:
                lost.add(id(d))
                self.log.warning("%s: lease lost to another worker; not extended", d.label)
            elif isinstance(ok, BaseException):
                self.log.warning("%s: lease renewal failed: %r", d.label, ok)
        return [d for d in ds if id(d) not in lost]
