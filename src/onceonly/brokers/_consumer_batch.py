# SPDX-License-Identifier: MIT
"""A batch of deliveries through ``AsyncInbox.process_batch``: one transaction, then a
settlement per delivery by the same verdicts as one delivery alone
(:meth:`~onceonly.brokers._consumer.Deliveries.judge`).

* Before the batch, each delivery passes :meth:`Deliveries.prepare`: the poison rule
  (a delivery counted past ``max_deliveries`` is dead-lettered unrun), decoding and the
  message id. Only the rest run.
* A message whose handler failed rolled back alone (its savepoint); its outcome's error
  is judged like a failure of that message alone (a counted retry, a dead letter…).
  A message held by another worker (in flight) is run again alone, which waits for it
  with backoff, uncounted, as one delivery would.
* A batch that fails as a whole: the store is unavailable (or has no tables) — nothing
  committed; the whole batch is tried again after the backoff while the consumer keeps
  the deliveries, uncounted, until it stops (then every delivery is handed back, none
  acked). Any other failure of the whole transaction (a handler that ended or broke
  it) — nothing committed either; the deliveries are run again one at a time, so the
  message that broke the batch is settled alone and the others commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from onceonly._core.settle import ACK, Action
from onceonly.brokers._consumer import Deliveries, Prepared, Settlement, pause, released
from onceonly.inbox import BatchItem

__all__ = ["run_batch"]


async def run_batch(
    dv: Deliveries, ps: Sequence[Prepared], stop: asyncio.Event | None
) -> list[Settlement]:
    """Run ``ps`` in one inbox transaction; one :class:`Settlement` per delivery, in order."""
    if len(ps) == 1:
        return [await dv.run(ps[0], stop)]
    items = [BatchItem(p.message_id, p.payload, p.delivery) for p in ps]
    raised: dict[str, BaseException] = {}
    handler = dv.recording(raised)
    label = f"batch of {len(ps)} ({ps[0].message_id}…)"
    uncounted = 0
    while True:
        raised.clear()
        try:
            outcomes = await dv.process_batch(items, handler)
            break
        except Exception as exc:
            if any(p.is_released() for p in ps):
                # a rebalance took some back (the batch's position write refused it):
                # those are left to their new holder; the rest run one at a time
                dv.log.info("%s: taken back in part by the broker: %s", label, exc)
                return [
                    released(p, exc, dv.log) if p.is_released() else await dv.run(p, stop)
                    for p in ps
                ]
            by_handler = exc if any(e is exc for e in raised.values()) else None
            decided = dv.judge(exc, by_handler, label=label, count=None, uncounted=uncounted)
            if decided.action is Action.RETRY and not decided.counted:
                uncounted += 1
                if not await pause(stop, decided.delay):
                    continue
                return [Settlement(decided, p.message_id) for p in ps]  # stopping: hand back
            dv.log.warning("%s: the batch failed as a whole; running it one at a time", label)
            return [await dv.run(p, stop) for p in ps]
    out: list[Settlement] = []
    alone: list[int] = []
    for i, (p, o) in enumerate(zip(ps, outcomes, strict=True)):
        if o.error is None:
            out.append(Settlement(ACK, p.message_id, o))
            continue
        error = o.error if isinstance(o.error, Exception) else RuntimeError(repr(o.error))
        decided = dv.judge(error, raised.get(p.message_id), label=p.message_id, count=p.count)
        if decided.action is Action.RETRY and not decided.counted:
            alone.append(i)  # in flight elsewhere: wait for it as one delivery would
        out.append(Settlement(decided, p.message_id))
    for i in alone:
        out[i] = await dv.run(ps[i], stop)
    return out
