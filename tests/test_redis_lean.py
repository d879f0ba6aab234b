"""The bare-connection hot path (chainrt.redis._lean): what it sends, what it hands back, and that
a call cut short never leaves its reply to be read by the next one. A real redis-server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from chainrt.redis import LeanRedis, pack

pytestmark = pytest.mark.redis


def test_pack_is_the_resp_encoding_of_each_argument() -> None:
    assert pack("SET", b"k\r\n", 7, 0.5) == (
        b"*4\r\n$3\r\nSET\r\n$3\r\nk\r\n\r\n$1\r\n7\r\n$3\r\n0.5\r\n"
    )
    assert pack("ECHO", "é") == b"*2\r\n$4\r\nECHO\r\n$2\r\n\xc3\xa9\r\n"
    with pytest.raises(TypeError, match="bool"):
        pack("SET", "k", True)


async def test_replies_and_error_replies_come_back_in_order(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    lean = LeanRedis(client, timeout_s=2.0)
    try:
        replies = await lean.call(
            [pack("SET", "k", "v"), pack("EVALSHA", "0" * 40, "0"), pack("GET", "k")], 3
        )
        assert replies[0] == b"OK"
        assert isinstance(replies[1], NoScriptError)
        assert replies[2] == b"v"
        (wrong,) = await lean.call([pack("HGET", "k", "f")])  # k holds a string
        assert isinstance(wrong, ResponseError)
        assert str(wrong).startswith("WRONGTYPE")
        # The error replies were read whole: the same connection goes on.
        assert await lean.call([pack("GET", "k")]) == [b"v"]
    finally:
        await lean.aclose()
        await client.aclose()


async def test_a_timed_out_call_leaves_no_reply_for_the_next(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    lean = LeanRedis(client, timeout_s=0.2)
    try:
        await client.rpush("late", "stale")
        with pytest.raises(TimeoutError):
            # The reply would come after 0.6 s; the call gives up at 0.2 s.
            await lean.call([pack("BLPOP", "never", "0.6")])
        # The next call must get its own reply, not the one still on its way to the old socket.
        assert await lean.call([pack("LPOP", "late")]) == [b"stale"]
        await asyncio.sleep(0.7)
        assert await lean.call([pack("ECHO", "mine")]) == [b"mine"]
    finally:
        await lean.aclose()
        await client.aclose()


async def test_a_cancelled_call_leaves_no_reply_for_the_next(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    lean = LeanRedis(client, timeout_s=None)
    try:
        task = asyncio.create_task(lean.call([pack("BLPOP", "q", "0")]))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client.rpush("q", "x")  # had the blocked call's socket been kept, it would pop x
        assert await lean.call([pack("LPOP", "q")]) == [b"x"]
    finally:
        await lean.aclose()
        await client.aclose()


async def test_the_connection_is_the_clients_password_and_db(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url.removesuffix("/0") + "/3")
    lean = LeanRedis(client, timeout_s=2.0)
    try:
        await lean.call([pack("SET", "where", "db3")])
        assert await client.get("where") == b"db3"
        other = aioredis.Redis.from_url(redis_url)
        assert await other.get("where") is None
        await other.aclose()
    finally:
        await lean.aclose()
        await client.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await lean.call([pack("PING")])


# Every kind of reply, each compared with what redis-py's own parser makes of the same command.
_SAMPLES: list[tuple[Any, ...]] = [
    ("SET", "s", "v"),  # simple string
    ("GET", "s"),  # bulk string
    ("GET", "missing"),  # null (RESP2: $-1, RESP3: _)
    ("INCR", "n"),  # integer
    ("RPUSH", "l", "a", "b\r\nc", ""),  # (integer) a bulk with CRLF inside, an empty one
    ("LRANGE", "l", "0", "-1"),  # array
    ("LRANGE", "none", "0", "-1"),  # empty array
    ("HSET", "h", "f", "1", "g", "2"),
    ("HGETALL", "h"),  # RESP3: map
    ("SADD", "set", "x"),
    ("SMEMBERS", "set"),  # RESP3: set
    ("ZADD", "z", "1.5", "m"),
    ("ZSCORE", "z", "m"),  # RESP3: double
    ("SET", "big", "x" * 200_000),  # a bulk longer than a stream reader's line limit
    ("GET", "big"),
    ("EVAL", "return {1, {2, 'x', {}}, 'y', false}", "0"),  # nested arrays, a Lua nil
    ("EVAL", "redis.setresp(3); return {true, false, {double = 2.5}}", "0"),  # bool, double
    ("EVAL", "redis.setresp(3); return {map = {a = 1}}", "0"),  # a map inside an array
    ("EVAL", "return redis.error_reply('MINE went wrong')", "0"),  # an error reply
    ("EVAL", "return {1, redis.error_reply('INSIDE an array')}", "0"),  # an error inside
    ("EVALSHA", "0" * 40, "0"),  # NOSCRIPT: its own exception type
    ("HGET", "s", "f"),  # WRONGTYPE
    ("LATENCY", "DOCTOR"),  # RESP3: a verbatim string
]


def _same(value: Any) -> Any:
    """``value`` with exceptions as (type, text), so that two readings compare equal."""
    if isinstance(value, BaseException):
        return (type(value), str(value))
    if isinstance(value, list):
        return [_same(v) for v in value]
    if isinstance(value, dict):
        return {k: _same(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize("decode", [False, True])
@pytest.mark.parametrize("protocol", [2, 3])
async def test_replies_read_as_redis_py_reads_them(
    redis_url: str, protocol: int, decode: bool
) -> None:
    client = aioredis.Redis.from_url(redis_url, protocol=protocol, decode_responses=decode)
    lean = LeanRedis(client, timeout_s=5.0)
    conn = client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
    try:
        await conn.connect()
        for sample in _SAMPLES:
            await client.flushdb()
            await conn.send_command(*sample)
            try:
                theirs = await conn.read_response()
            except ResponseError as exc:
                theirs = exc
            await client.flushdb()
            ours = await lean.call([pack(*sample)])
            assert _same(ours) == [_same(theirs)], sample
        # All at once on one connection, replies in order (and the connection still in step).
        await client.flushdb()
        replies = await lean.call([pack(*s) for s in _SAMPLES], len(_SAMPLES))
        assert len(replies) == len(_SAMPLES)
        assert await lean.call([pack("ECHO", "after")]) == ["after" if decode else b"after"]
    finally:
        await conn.disconnect()
        await lean.aclose()
        await client.aclose()


async def test_a_connection_lost_mid_reply_is_a_connection_error(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    lean = LeanRedis(client, timeout_s=5.0)
    try:
        await lean.call([pack("PING")])
        (conn,) = lean._idle
        await client.client_kill_filter(_type="normal", skipme=True)  # the bare one, not ours
        with pytest.raises(RedisConnectionError):
            await lean.call([pack("PING")])
        assert conn not in lean._idle  # closed, never reused
        assert await lean.call([pack("PING")]) == [b"PONG"]  # a new connection
    finally:
        await lean.aclose()
        await client.aclose()
