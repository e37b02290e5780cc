# SPDX-License-Identifier: MIT
"""What only the Redis store does: its keys, its expiry, its round trips, its refusals.

The store contract itself runs in tests/contract (the leased-mode tests), the model test
in tests/property/test_model_actors.py and the races in tests/races, all on Redis too.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

import onceonly
from onceonly._core.state import Policy, claim_write
from onceonly._runtime import new_token
from onceonly.inbox import LeasedRunner
from onceonly.stores.redis._lua import record_key
from tests.conftest import REDIS_URL, StoreFactory, drop_redis_prefix, require_redis


@pytest.fixture
def factory(tmp_path: Any) -> Iterator[StoreFactory]:
    f = StoreFactory("redis", tmp_path)
    yield f
    f.close()


@pytest.fixture
def store(factory: StoreFactory) -> Any:
    s = factory()
    s.migrate()
    return s


@pytest.fixture
def client() -> Iterator[Any]:
    import redis

    require_redis()
    with redis.Redis.from_url(REDIS_URL) as r:
        yield r


def key_of(store: Any, scope: str, key: str) -> str:
    return record_key(store.prefix, scope, key)


def test_one_hash_per_record_under_a_hash_tagged_key(store: Any, client: Any) -> None:
    """A record is one hash at {prefix}{len:scope:key}; scopes with ':' never collide."""

    @onceonly.idempotent(store, key=lambda k: k, scope="a:b")
    def f(k: str) -> str:
        return "ab"

    @onceonly.idempotent(store, key=lambda k: k, scope="a")
    def g(k: str) -> str:
        return "a"

    assert f("c") == "ab" and g("b:c") == "a"  # ("a:b", "c") and ("a", "b:c") stay apart
    assert f("c") == "ab" and g("b:c") == "a"
    keys = sorted(k.decode() for k in client.scan_iter(match=f"{store.prefix}*"))
    assert keys == sorted([f"{store.prefix}{{3:a:b:c}}", f"{store.prefix}{{1:a:b:c}}"])
    assert all(client.type(k) == b"hash" for k in keys)


def test_completion_sets_pexpireat_from_the_server_clock(store: Any, client: Any) -> None:
    """A completed record expires in Redis at its expires_at; a claim never expires."""
    runner = LeasedRunner(store, scope="fn", policy=Policy(30, 5), ttl=60.0, wait=0.1)
    claim = runner.claim("k", None)
    assert isinstance(claim, onceonly.Claim)
    k = key_of(store, "fn", "k")
    assert client.pttl(k) == -1  # in progress: no expiry
    runner.run("k2", None, lambda: 1)
    k2 = key_of(store, "fn", "k2")
    with store.session() as s:
        record = s.get("fn", "k2").record
    assert record is not None and record.expires_at is not None
    assert client.pexpiretime(k2) == pytest.approx(record.expires_at * 1000, abs=1)
    assert 59_000 < client.pttl(k2) <= 60_001


def test_expiry_is_judged_by_expires_at_not_by_redis_removing_the_key(
    store: Any, client: Any
) -> None:
    """A completed record past its expires_at runs again even while Redis still holds
    the key (lazy expiry, a replica, a clock step): and the retaken claim has no expiry."""
    calls: list[int] = []

    @onceonly.idempotent(store, key=lambda: "k", scope="fn", ttl=3600)
    def f() -> int:
        calls.append(1)
        return len(calls)

    assert f() == f() == 1
    k = key_of(store, "fn", "k")
    past = int(client.hget(k, "expires_at")) - 3601 * 1_000_000
    client.hset(k, "expires_at", past)  # expired by the record, not yet by Redis
    assert client.exists(k)
    assert f() == 2
    assert calls == [1, 1]
    assert 3_590_000 < client.pttl(k) <= 3_600_001  # the new completion's own expiry


def test_round_trips_new_key_and_replay(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the wire, a new key costs 2 requests (claim, completion) and a replay 1, each one
    EVALSHA of one key: the claim with one argument (the write), the completion with four
    (the expected version, the write)."""
    import redis.connection

    sent: list[bytes] = []
    cls: Any = redis.connection.AbstractConnection
    original = cls.send_packed_command

    def counted(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(command if isinstance(command, bytes) else b"".join(command))
        return original(self, command, *args, **kwargs)

    monkeypatch.setattr(cls, "send_packed_command", counted)

    def head(command: bytes) -> list[bytes]:
        parts = command.split(b"\r\n")
        return [parts[0], parts[2], parts[3], parts[6]]

    @onceonly.idempotent(store, key=lambda n: str(n), scope="double", lease=30)
    def f(n: int) -> int:
        return n * 2

    assert f(21) == 42
    new = [head(c) for c in sent]
    sent.clear()
    assert f(21) == 42
    replay = [head(c) for c in sent]
    # [array length, command, sha length, numkeys]: *5 = EVALSHA sha 1 key write
    claim = [b"*5", b"EVALSHA", b"$40", b"1"]
    assert (new, replay) == ([claim, [b"*8", b"EVALSHA", b"$40", b"1"]], [claim])


async def test_async_round_trips_new_key_and_replay(
    factory: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The async store on the wire: 2 requests for a new key, 1 for a replay, the same
    EVALSHA commands as the sync store's."""
    import redis.asyncio.connection

    require_redis()
    sent: list[bytes] = []
    cls: Any = redis.asyncio.connection.AbstractConnection
    original = cls.send_packed_command

    async def counted(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(command if isinstance(command, bytes) else b"".join(command))
        return await original(self, command, *args, **kwargs)

    astore = onceonly.open_async_store(REDIS_URL, prefix=factory.table)
    await astore.migrate()
    monkeypatch.setattr(cls, "send_packed_command", counted)
    try:

        @onceonly.idempotent(astore, key=lambda n: str(n), scope="double", lease=30)
        async def f(n: int) -> int:
            return n * 2

        assert await f(21) == 42
        new = [c.split(b"\r\n")[0:7:2] for c in sent]
        sent.clear()
        assert await f(21) == 42
        replay = [c.split(b"\r\n")[0:7:2] for c in sent]
    finally:
        await astore.close()
    heads = [[c[0], c[1], c[3]] for c in new + replay]  # count, command, numkeys
    claim, completion = [b"*5", b"EVALSHA", b"1"], [b"*8", b"EVALSHA", b"1"]
    assert (len(new), heads) == (2, [claim, completion, claim])


def test_lost_script_cache_is_loaded_again(store: Any, client: Any) -> None:
    """After SCRIPT FLUSH (what a restart does to the cache) every call loads its script
    again on NOSCRIPT and goes on: a claim, a completion, a replay."""
    client.script_flush()
    calls: list[int] = []

    @onceonly.idempotent(store, key=lambda: "k", scope="fn", lease=30)
    def f() -> int:
        calls.append(1)
        return 7

    assert f() == 7
    client.script_flush()
    assert f() == 7
    assert calls == [1]


async def test_async_lost_script_cache_is_loaded_again(factory: StoreFactory, client: Any) -> None:
    """The async store loads its scripts again on NOSCRIPT too."""
    astore = onceonly.open_async_store(REDIS_URL, prefix=factory.table)
    calls: list[int] = []
    try:

        @onceonly.idempotent(astore, key=lambda: "k", scope="fn", lease=30)
        async def f() -> int:
            calls.append(1)
            return 7

        client.script_flush()
        assert await f() == 7
        client.script_flush()
        assert await f() == 7
        assert calls == [1]
    finally:
        await astore.close()


def test_write_arg_is_the_json_of_its_fields() -> None:
    """The hand-built write argument is the JSON the scripts decode: the same text as
    json.dumps of its fields, for values that need escaping too."""
    import json

    from onceonly._core.state import State, Write
    from onceonly.stores.redis._lua import micros, write_arg

    odd = 'q"uo\\te \n\t\x00 \u00e9\u2028 \U0001f600 ]"}'
    writes = [
        Write(State.IN_PROGRESS, 2**62 + 1, None, 0, lease_seconds=30.0000015),
        Write(State.COMPLETED, 7, odd, 3, result=odd, ttl_seconds=0.5, completed=True),
        Write(State.FAILED, 8, "fp", 4, error=odd, payload=odd, checkpoint=odd,
              lease_seconds=1.5, keep_checkpoint=True),
    ]  # fmt: skip
    for w in writes:
        fields = [
            ("state", w.state.value), ("token", str(w.token)), ("attempts", str(w.attempts)),
            ("fingerprint", w.fingerprint), ("result", w.result), ("error", w.error),
            ("payload", w.payload), ("checkpoint", w.checkpoint),
        ]  # fmt: skip
        expected = [
            "" if w.lease_seconds is None else micros(w.lease_seconds),
            "" if w.ttl_seconds is None else micros(w.ttl_seconds),
            "1" if w.completed else "0",
            "1" if w.keep_checkpoint else "0",
        ]
        for name, value in fields:
            if value is not None:
                expected += [name, value]
        text = write_arg(w)
        assert text == json.dumps(expected, ensure_ascii=False, separators=(",", ":"))
        assert json.loads(text) == expected


def test_inbox_on_redis_is_leased(store: Any) -> None:
    """Atomic mode is impossible on Redis: Inbox runs leased, and refuses mode='atomic'."""
    assert onceonly.Inbox(store, consumer="billing").mode == "leased"
    with pytest.raises(onceonly.ConfigurationError, match="mode='leased'"):
        onceonly.Inbox(store, consumer="billing", mode="atomic")
    with pytest.raises(onceonly.ConfigurationError, match="leased mode"), store.transaction():
        pass


async def test_async_inbox_on_redis_is_leased(factory: StoreFactory) -> None:
    """The async store gets a leased AsyncInbox the same way."""
    require_redis()
    astore = onceonly.open_async_store(REDIS_URL, prefix=factory.table)
    try:
        assert onceonly.AsyncInbox(astore, consumer="billing").mode == "leased"
        with pytest.raises(onceonly.ConfigurationError, match="mode='leased'"):
            onceonly.AsyncInbox(astore, consumer="billing", mode="atomic")
    finally:
        await astore.close()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"table": "t"}, "unknown option table"),
        ({"prefix": "a{b}:"}, "braces"),
        ({"prefix": 3}, "prefix must be a str"),
    ],
)
def test_bad_options_are_configuration_errors(options: dict[str, Any], match: str) -> None:
    """Options the store does not take, or a prefix that would break hash tags."""
    with pytest.raises(onceonly.ConfigurationError, match=match):
        onceonly.open_store(REDIS_URL, **options)
    with pytest.raises(onceonly.ConfigurationError, match=match):
        onceonly.open_async_store(REDIS_URL, **options)


def test_rediss_url_opens_a_tls_client() -> None:
    """rediss:// is accepted (TLS); nothing connects until the first operation."""
    store = onceonly.open_store("rediss://127.0.0.1:1/0", prefix="x:")
    try:
        assert store.client.connection_pool.connection_class.__name__ == "SSLConnection"
    finally:
        store.close()


def test_unreachable_redis_is_store_unavailable() -> None:
    """Nothing listening: every operation raises StoreUnavailable (transient)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = onceonly.open_store(f"redis://127.0.0.1:{port}/0", socket_timeout=1)
    try:
        with pytest.raises(onceonly.StoreUnavailable), store.session() as session:
            session.claim("fn", "k", claim_write(None, new_token(), Policy(30, 5)))
    finally:
        store.close()


def test_foreign_values_are_typed_errors(store: Any, client: Any) -> None:
    """A hash onceonly did not write (an unknown state, bytes that are not UTF-8) is
    CorruptRecord; another type at the key StoreError."""
    client.hset(key_of(store, "fn", "odd"), mapping={"state": "exploded", "token": 1})
    client.set(key_of(store, "fn", "str"), "not a hash")
    bad_utf8 = {"state": "completed", "token": 1, "attempts": 0, "result": b"\xff\xfe"}
    client.hset(key_of(store, "fn", "bytes"), mapping=bad_utf8)
    with store.session() as s:
        with pytest.raises(onceonly.CorruptRecord):
            s.get("fn", "odd")
        with pytest.raises(onceonly.CorruptRecord):
            s.get("fn", "bytes")
        with pytest.raises(onceonly.StoreError, match="WRONGTYPE"):
            s.get("fn", "str")


def test_a_user_client_is_used_and_left_open(client: Any) -> None:
    """client= runs the store on the caller's redis-py client, which close() leaves open."""
    prefix = f"user_{time.monotonic_ns()}:"
    from onceonly.stores.redis import RedisStore

    store = RedisStore(client=client, prefix=prefix)
    try:

        @onceonly.idempotent(store, key=lambda: "k", scope="fn")
        def f() -> str:
            return "ok"

        assert f() == f() == "ok"
        store.close()
        assert client.ping()
    finally:
        drop_redis_prefix(prefix)


async def test_async_store_runs_and_replays(factory: StoreFactory) -> None:
    """The async store: one run, then replays, with a checkpoint saved on the way."""
    require_redis()
    astore = onceonly.open_async_store(REDIS_URL, prefix=factory.table)
    await astore.migrate()
    calls: list[int] = []
    try:

        @onceonly.idempotent(astore, key=lambda n: str(n), scope="fn", lease=5)
        async def f(n: int) -> int:
            await onceonly.current_async_claim().checkpoint("half", n)
            calls.append(n)
            return n + 1

        assert [await f(1), await f(1), await f(2)] == [2, 2, 3]
        assert calls == [1, 2]
    finally:
        await astore.close()


def test_a_written_record_equals_the_stored_one(store: Any) -> None:
    """What claim and update return (built from the write) is the hash, field for field:
    a claim, a takeover keeping a checkpoint, a completion with a ttl."""
    from onceonly._core.state import Expect, State, Write, complete_write

    policy = Policy(0.2, 5)
    with store.session() as s:
        first = s.claim("fn", "k", claim_write("fp", new_token(), policy))
        assert first.inserted and first.record == s.get("fn", "k").record
        assert s.save_checkpoint("fn", "k", first.record.token, '{"a":1}', None)
        time.sleep(0.25)
        token = new_token()
        takeover = Write(
            State.IN_PROGRESS, token, "fp", 1, lease_seconds=30, checkpoint=None,
            keep_checkpoint=True,
        )  # fmt: skip
        taken = s.update("fn", "k", Expect(first.record.token, State.IN_PROGRESS, lapsed=True),
                         takeover)  # fmt: skip
        assert taken is not None and taken.checkpoint == '{"a":1}'
        assert taken == s.get("fn", "k").record
        done = s.update("fn", "k", Expect.holder(token), complete_write(taken, "1", 60.5))
        assert done is not None and done == s.get("fn", "k").record
        assert done.created_at == first.record.created_at and done.expires_at is not None
