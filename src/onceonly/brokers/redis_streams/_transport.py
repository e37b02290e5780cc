# SPDX-License-Identifier: MIT
"""Redis Streams as a :class:`~onceonly.brokers._loop.Transport`: one member of a
consumer group (XREADGROUP, XAUTOCLAIM of idle entries, XCLAIM of its own failed
entries when their backoff is over, batched XACK, idle-time resets as the lease)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis.asyncio
from redis.exceptions import RedisError, ResponseError

from onceonly._core.window import Bound
from onceonly.brokers._transport import Incoming
from onceonly.brokers.redis_streams import _wire as wire
from onceonly.errors import BrokerUnavailable, ConfigurationError

__all__ = ["RedisStreamsTransport"]

HEARTBEAT_BATCH = 500

# Reset the idle time of the entries this consumer still owns; returns the ids kept.
_HEARTBEAT = """
local kept = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p > 0 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    kept[#kept + 1] = ARGV[i]
  end
end
return kept
"""

# Fetch again an entry this consumer still owns: nil if it does not, {} if the entry
# was deleted from the stream, else {entry, delivery count}.
_REFETCH = """
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then return false end
local e = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3])
if #e == 0 or not e[1][2] then return {} end
p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
return {e[1], p[1][4]}
"""

# Leave the group on a clean stop, unless entries are still pending on this consumer.
_LEAVE = """
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) > 0 then return -1 end
return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
"""


# Delete the group's members (other than ARGV[3]) idle for ARGV[2] ms with nothing
# pending: what a killed consumer leaves behind. Atomic, so a member that reads
# meanwhile (and would lose its pending list with it) is never deleted.
_FORGET_IDLE = """
local gone = {}
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local f = {}
  for i = 1, #c, 2 do f[c[i]] = c[i + 1] end
  if f['name'] ~= ARGV[3] and f['pending'] == 0 and f['idle'] >= tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], f['name'])
    gone[#gone + 1] = f['name']
  end
end
return gone
"""


class RedisStreamsTransport:
    """A failed entry stays in this consumer's pending list and is fetched again (XCLAIM,
    counted by Redis) once its delay is over; entries idle ``claim_idle`` are taken over."""

    delays_retries = True

    def __init__(
        self,
        client: redis.asyncio.Redis,
        *,
        owns_client: bool,
        stream: str,
        group: str,
        consumer_name: str,
        start_id: str,
        block_ms: int,
        count: int,
        claim_idle: float,
        dead_letter: str,
        log: logging.Logger,
        forget_idle: float | None = None,
    ) -> None:
        self.client = client
        self._owns_client = owns_client
        self.stream = stream
        self.group = group
        self.consumer_name = consumer_name
        self.start_id = start_id
        self.block_ms = block_ms
        self.count = count
        self.claim_idle = claim_idle
        self.dead_letter_stream = dead_letter
        self.log = log
        self.where = f"stream {stream} group {group}"
        self.extend_every: float | None = claim_idle / 3
        self._heartbeat = client.register_script(_HEARTBEAT)
        self._refetch = client.register_script(_REFETCH)
        self._leave = client.register_script(_LEAVE)
        self._forget = client.register_script(_FORGET_IDLE)
        self.forget_idle = forget_idle
        self._next_forget = 0.0
        self._active: set[str] = set()  # entries whose handler runs here
        self._retry_at: dict[str, float] = {}  # failed entries we own -> when to refetch
        self._next_claim = 0.0
        self._claim_cursor = "0-0"
        self._stopping = False
        self._ack_ids: list[str] = []  # acks waiting for the next XACK
        self._ack_done: asyncio.Future[None] | None = None  # resolved by that XACK
        self._ack_task: asyncio.Task[None] | None = None

    async def ensure_group(self) -> None:
        """Create the group (and the stream) unless it exists."""
        try:
            await self.client.xgroup_create(
                self.stream, self.group, id=self.start_id, mkstream=True
            )
        except ResponseError as exc:
            if "BUSYGROUP" in str(exc):
                return
            raise ConfigurationError(
                f"cannot create group {self.group!r} on {self.stream!r}: {exc}"
            ) from exc

    async def open(self) -> None:
        self._stopping = False
        self._next_claim, self._claim_cursor = 0.0, "0-0"
        await self.ensure_group()
        self._next_forget = 0.0
        await self._forget_idle()

    async def _forget_idle(self) -> None:
        """Delete members idle ``forget_idle`` seconds with nothing pending (killed
        consumers; their pending entries are taken over by XAUTOCLAIM first); then again
        every ``forget_idle / 2`` seconds."""
        if self.forget_idle is None or time.monotonic() < self._next_forget:
            return
        self._next_forget = time.monotonic() + self.forget_idle / 2
        idle_ms = max(1, int(self.forget_idle * 1000))
        gone: Any = await self._forget(
            keys=[self.stream], args=[self.group, idle_ms, self.consumer_name]
        )
        for name in gone or ():
            self.log.info("%s: removed idle consumer %s", self.where, wire.text(name))

    async def bounds(self, redeliveries: Callable[[float, str], Bound]) -> list[Bound]:
        return [redeliveries(self.claim_idle, "claim_idle")]

    # -- receiving ------------------------------------------------------------------

    async def receive(self, limit: int) -> Sequence[Incoming]:
        out: list[Incoming] = []
        try:
            await self._forget_idle()
            await self._refetch_due(limit, out)
            if len(out) < limit and time.monotonic() >= self._next_claim:
                await self._autoclaim(limit - len(out), out)
            if len(out) < limit:
                await self._read_new(limit - len(out), out)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self.log.warning("%s: group %s vanished; recreating it", self.stream, self.group)
            await self.ensure_group()
        except (RedisError, OSError) as exc:
            if out:
                return out
            raise BrokerUnavailable(f"read from {self.stream} failed: {exc!r}") from exc
        return out

    def _block_ms(self) -> int:
        wake = self._next_claim
        if self._retry_at:
            wake = min(wake, *self._retry_at.values())
        until = int((wake - time.monotonic()) * 1000)
        return max(1, min(self.block_ms, until))

    async def _read_new(self, free: int, out: list[Incoming]) -> None:
        reply: Any = await self.client.xreadgroup(
            self.group,
            self.consumer_name,
            {self.stream: ">"},
            count=min(free, self.count),
            block=self._block_ms(),
        )
        for _, entries in reply or ():
            for entry_id, fields in entries:
                out.append(self._incoming(wire.text(entry_id), fields, 1))

    async def _autoclaim(self, free: int, out: list[Incoming]) -> None:
        """Take over entries idle for ``claim_idle`` (a dead consumer's, or lost ones)."""
        reply: Any = await self.client.xautoclaim(
            self.stream,
            self.group,
            self.consumer_name,
            min_idle_time=int(self.claim_idle * 1000),
            start_id=self._claim_cursor,
            count=free,
        )
        self._claim_cursor = wire.text(reply[0])
        if self._claim_cursor == "0-0":
            self._next_claim = time.monotonic() + self.claim_idle / 2
        for gone in reply[2] if len(reply) > 2 else ():
            self.log.warning("entry %s: deleted from the stream before it was acked", gone)
        claimed = [(wire.text(i), f) for i, f in reply[1] if f and wire.text(i) not in self._active]
        if not claimed:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for entry_id, _ in claimed:
                pipe.xpending_range(self.stream, self.group, entry_id, entry_id, 1)
            pending = await pipe.execute()
        for (entry_id, fields), info in zip(claimed, pending, strict=True):
            count = int(info[0]["times_delivered"]) if info else 2
            self._retry_at.pop(entry_id, None)
            label = wire.label(entry_id, fields)
            self.log.info("%s: took over entry %s (delivery %d)", label, entry_id, count)
            out.append(self._incoming(entry_id, fields, count))

    async def _refetch_due(self, free: int, out: list[Incoming]) -> None:
        """Fetch again the failed entries whose backoff has passed."""
        now = time.monotonic()
        due = sorted((at, e) for e, at in self._retry_at.items() if at <= now)[:free]
        for _, entry_id in due:
            reply: Any = await self._refetch(
                keys=[self.stream], args=[self.group, self.consumer_name, entry_id]
            )
            self._retry_at.pop(entry_id, None)
            if reply is None:
                self.log.info("entry %s: another consumer took it over", entry_id)
            elif not reply:
                self.log.warning("entry %s: deleted from the stream before it was acked", entry_id)
            else:
                (_, flat), count = reply
                fields = dict(zip(flat[::2], flat[1::2], strict=True))
                out.append(self._incoming(entry_id, fields, int(count)))

    def _incoming(self, entry_id: str, raw: Mapping[Any, Any], count: int) -> Incoming:
        self._active.add(entry_id)
        fields = {wire.text(k): v for k, v in raw.items()}
        headers = wire.headers_of(fields.get(wire.FIELD_HEADERS))
        mid = wire.broker_id(fields, headers)
        return Incoming(
            broker_id=mid,
            body=wire.body(fields),
            headers=headers,
            delivery_count=count,
            source=self.stream,
            raw=wire.StreamEntry(self.stream, entry_id, fields),
            label=mid or f"entry {entry_id}",
        )

    # -- settling -------------------------------------------------------------------

    async def widen(self) -> None:
        """Nothing to widen: ``receive`` pulls only what the loop asks for."""

    def wake(self) -> None:
        """Nothing to wake: ``receive`` returns within its poll timeout."""

    async def ack(self, d: Incoming) -> None:
        """XACK, in one XACK with the others acked meanwhile; wait for it."""
        entry_id = d.raw.entry_id
        self._active.discard(entry_id)
        if self._ack_done is None:
            self._ack_done = asyncio.get_running_loop().create_future()
        done = self._ack_done
        self._ack_ids.append(entry_id)
        if self._ack_task is None or self._ack_task.done():
            self._ack_task = asyncio.ensure_future(self._flush_acks())
        await asyncio.shield(done)

    async def _flush_acks(self) -> None:
        while self._ack_ids:
            ids, done = self._ack_ids, self._ack_done
            self._ack_ids, self._ack_done = [], None
            assert done is not None
            try:
                await self.client.xack(self.stream, self.group, *ids)
            except BaseException as exc:
                done.set_exception(exc)
                done.exception()  # retrieved: every waiter may have been cancelled
                if not isinstance(exc, Exception):
                    raise
            else:
                done.set_result(None)

    async def retry(self, d: Incoming, delay: float) -> None:
        """Leave it pending here, fetched again after ``delay`` (when stopping: left
        pending, for a takeover or the next run)."""
        entry_id = d.raw.entry_id
        self._active.discard(entry_id)
        if not self._stopping:
            self._retry_at[entry_id] = time.monotonic() + delay

    async def dead_letter(
        self, d: Incoming, headers: dict[str, Any], message_id: str | None
    ) -> None:
        dead = wire.dead_letter_fields(d.raw.fields, headers, message_id)
        await self.client.xadd(self.dead_letter_stream, dead)  # type: ignore[arg-type]

    async def extend(self, ds: Sequence[Incoming]) -> None:
        """Reset the idle time of the entries in flight and of those waiting for their
        retry (only while this consumer still owns them)."""
        ids = sorted({d.raw.entry_id for d in ds} | self._retry_at.keys())
        for i in range(0, len(ids), HEARTBEAT_BATCH):
            batch = ids[i : i + HEARTBEAT_BATCH]
            kept = await self._heartbeat(
                keys=[self.stream], args=[self.group, self.consumer_name, *batch]
            )
            for entry_id in set(batch) - {wire.text(k) for k in kept}:
                if self._retry_at.pop(entry_id, None) is not None:
                    self.log.info("entry %s: another consumer took it over", entry_id)

    async def stop_receiving(self) -> None:
        self._stopping = True

    async def close(self, graceful: bool) -> None:
        self._retry_at.clear()
        if self._ack_task is not None:
            await asyncio.gather(self._ack_task, return_exceptions=True)
        if graceful:
            try:
                await self._leave(keys=[self.stream], args=[self.group, self.consumer_name])
            except (RedisError, OSError) as exc:
                self.log.info("%s: could not leave group %s: %r", self.stream, self.group, exc)
        if self._owns_client:
            with contextlib.suppress(Exception):
                await self.client.aclose()
