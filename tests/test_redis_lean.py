"""The bare-connection hot path (chainrt.store._lean): what it sends, what it hands back, and that
a call cut short never leaves its reply to be read by the next one. A real redis-server."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, ResponseError

from chainrt.store._lean import LeanRedis, pack

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
