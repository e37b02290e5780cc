# SPDX-License-Identifier: MIT
"""Redis Streams as a :class:`~onceonly.brokers._loop.Transport`: one member of a
consumer group (XREADGROUP, XAUTOCLAIM of idle entries, XCLAIM of its own failed
entries when their backoff is over, batched XACK, idle-time resets as the lease).

Acks ride with reads. :meth:`RedisStreamsTransport.ack` queues the entry id (the inbox
has committed) and returns; when the loop starts its next read within the same turn of
the event loop (as it does once the acked delivery's slot is free), one script XACKs the
queued ids and then reads new entries without blocking: one round trip (EVALSHA), the
XACK before Redis hands out more entries. Only when that finds no new entry does a
blocking XREADGROUP follow (an idle stream). While a read is already on the wire, the
queued ids wait for it to end (at most :data:`ACK_LINGER`) and ride with the read the
loop starts next; ids that no read takes (an idle stream, a batch gathering, a stop) go
as one XACK of their own. An XACK that fails leaves its entries pending here: they are
fetched again at once (XCLAIM), the inbox replays them and they are acked again.
:meth:`~RedisStreamsTransport.close` sends what is still queued."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

import redis.asyncio
from redis.exceptions import RedisError, ResponseError

from onceonly._core.window import Bound
from onceonly.brokers._transport import Incoming
from onceonly.brokers.redis_streams import _wire as wire
from onceonly.errors import BrokerUnavailable, ConfigurationError

__all__ = ["RedisStreamsTransport"]

HEARTBEAT_BATCH = 500
#: The longest an ack waits for a read on the wire to end (then the read after it takes
#: the ack), before it is sent alone: a read returns at once on a busy stream, and
#: blocks up to ``block_ms`` on an idle one.
ACK_LINGER = 0.005

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

# Acknowledge ARGV[4..] (acked after their commit), then read up to ARGV[3] new entries
# without blocking (a script cannot block): one round trip, the XACK first.
_ACK_READ = """
if #ARGV > 3 then redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 4)) end
return {0, redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3],
                      'STREAMS', KEYS[1], '>')}
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
        self._ack_read = client.register_script(_ACK_READ)
        self._forget = client.register_script(_FORGET_IDLE)
        self.forget_idle = forget_idle
        self._next_forget = 0.0
        self._active: set[str] = set()  # entries whose handler runs here
        self._retry_at: dict[str, float] = {}  # failed entries we own -> when to refetch
        self._next_claim = 0.0
        self._claim_cursor = "0-0"
        self._stopping = False
        self._ack_ids: list[str] = []  # acked here, not sent yet
        self._ack_task: asyncio.Task[None] | None = None  # sends them unless a read does
        self._flush_armed = False  # a look at the queued acks is due (_flush_check)
        self._read_starting = False  # receive() was called; its read takes the acks
        self._read_done: asyncio.Future[None] | None = None  # of the read on the wire

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
        self._stopping = self._read_starting = False
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

    def receive(self, limit: int) -> Coroutine[Any, Any, Sequence[Incoming]]:
        # Not a coroutine function: the acks queued so far are promised to this read
        # when the loop asks for it, before the flusher's next turn.
        self._read_starting = True
        return self._receive(limit)

    async def _receive(self, limit: int) -> Sequence[Incoming]:
        self._read_starting = False
        out: list[Incoming] = []
        self._read_done = done = asyncio.get_running_loop().create_future()
        try:
            await self._forget_idle()
            await self._refetch_due(limit, out)
            if len(out) < limit and time.monotonic() >= self._next_claim:
                await self._autoclaim(limit - len(out), out)
            if len(out) < limit:
                await self._read_new(limit - len(out), out)
            elif self._ack_ids:  # refetched and taken-over entries filled it: no read
                await self._send_acks()
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self.log.warning("%s: group %s vanished; recreating it", self.stream, self.group)
            await self.ensure_group()
        except (RedisError, OSError) as exc:
            if out:
                return out
            raise BrokerUnavailable(f"read from {self.stream} failed: {exc!r}") from exc
        finally:
            done.set_result(None)
        return out

    def _block_ms(self) -> int:
        wake = self._next_claim
        if self._retry_at:
            wake = min(wake, *self._retry_at.values())
        until = int((wake - time.monotonic()) * 1000)
        return max(1, min(self.block_ms, until))

    async def _read_new(self, free: int, out: list[Incoming]) -> None:
        """Up to ``free`` new entries. With acks queued: one script XACKs them and reads
        without blocking, in one round trip; only when that finds no new entry does a
        blocking XREADGROUP follow. Acks whose script failed go to the flusher."""
        count = min(free, self.count)
        acks, self._ack_ids = self._ack_ids, []
        if acks:
            try:
                reply: Any = await self._ack_read(
                    keys=[self.stream], args=[self.group, self.consumer_name, count, *acks]
                )
            except BaseException:
                self._ack_ids[:0] = acks  # maybe not sent: on their own (or close())
                self._flush_soon()
                raise
            for _, entries in reply[1] or ():
                for entry_id, flat in entries:
                    fields = dict(zip(flat[::2], flat[1::2], strict=True))
                    out.append(self._incoming(wire.text(entry_id), fields, 1))
            if out:
                return
        reply = await self.client.xreadgroup(
            self.group, self.consumer_name, {self.stream: ">"}, count=count, block=self._block_ms()
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
        """Queue the XACK (see the module): it rides with the next read, else goes alone
        a turn later, in one XACK with the others queued meanwhile."""
        entry_id = d.raw.entry_id
        self._active.discard(entry_id)
        self._ack_ids.append(entry_id)
        self._flush_soon()

    def _flush_soon(self) -> None:
        """Look at the queued acks one turn from now (two callbacks: after the loop's
        step that this ack's slot wakes, which starts the next read if there is one); a
        task only when a read is on the wire or the acks must go alone."""
        if self._flush_armed or not (self._ack_task is None or self._ack_task.done()):
            return  # a look is due, or the running flush sees these too
        self._flush_armed = True
        loop = asyncio.get_running_loop()
        loop.call_soon(loop.call_soon, self._flush_check)

    def _flush_check(self) -> None:
        self._flush_armed = False
        if not self._ack_ids or self._read_starting:
            return  # a read the loop has started takes them
        if self._ack_task is None or self._ack_task.done():
            self._ack_task = asyncio.ensure_future(self._flush_acks())

    async def _flush_acks(self) -> None:
        deadline = time.monotonic() + ACK_LINGER
        while self._ack_ids and not self._read_starting:
            reading, left = self._read_done, deadline - time.monotonic()
            if reading is None or reading.done() or left <= 0:
                await self._send_acks()
                continue
            # a read is on the wire: on a busy stream it returns at once, and the read
            # the loop starts next (in that same turn) takes these acks
            await asyncio.wait({reading}, timeout=left)
            await asyncio.sleep(0)

    async def _send_acks(self) -> None:
        ids, self._ack_ids = self._ack_ids, []
        try:
            await self.client.xack(self.stream, self.group, *ids)
        except (RedisError, OSError) as exc:
            self._ack_failed(ids, exc)
        except BaseException:
            self._ack_ids[:0] = ids  # cancelled: close() sends them
            raise

    def _ack_failed(self, ids: list[str], exc: BaseException) -> None:
        """The XACK of ``ids`` failed (maybe after Redis ran it): fetch them again at
        once, to be replayed and acked (when stopping: left pending, for a takeover or
        the next run)."""
        self.log.warning("%s: XACK of %d entries failed: %r", self.where, len(ids), exc)
        if not self._stopping:
            now = time.monotonic()
            for entry_id in ids:
                self._retry_at[entry_id] = now

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
        self._read_starting = False  # a read cancelled before it started takes nothing

    async def close(self, graceful: bool) -> None:
        self._retry_at.clear()
        self._read_starting = False
        if self._ack_task is not None:
            await asyncio.gather(self._ack_task, return_exceptions=True)
        while self._ack_ids:
            await self._send_acks()
        if graceful:
            try:
                await self._leave(keys=[self.stream], args=[self.group, self.consumer_name])
            except (RedisError, OSError) as exc:
                self.log.info("%s: could not leave group %s: %r", self.stream, self.group, exc)
        if self._owns_client:
            with contextlib.suppress(Exception):
                await self.client.aclose()
