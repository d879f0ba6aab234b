"""Commands pipelined on one connection (chainrt.redis._pipe, LeanRedis.pipelined): written as they
come (never behind another's round trip), a loop turn's commands in one write, replies handed out
in order, and a pipe that breaks (timeout, lost connection, a reply nobody asked for, close) fails
what it had in flight and is replaced. A real redis-server; BLPOP holds a reply as long as a test
needs (Redis answers one connection's commands in order, so it holds the ones behind it too)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from chainrt.redis import LeanRedis, pack
from chainrt.redis._pipe import Pipe

pytestmark = pytest.mark.redis


class _Writes:
    """The pipe's writer, with every write recorded (and whether the held reply had come)."""

    def __init__(self, writer: Any) -> None:
        self._writer = writer
        self.log: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.log.append(data)
        self._writer.write(data)


async def _pipe(client: aioredis.Redis, timeout_s: float | None = 2.0) -> tuple[Pipe, _Writes]:
    lean = LeanRedis(client, timeout_s=timeout_s)
    await lean.pipelined(pack("PING"))
    pipe = lean._pipe
    assert pipe is not None
    writes = _Writes(pipe._writer)
    pipe._writer = writes
    return pipe, writes


async def _clients(client: aioredis.Redis) -> int:
    return int((await client.info("clients"))["connected_clients"])


async def test_a_lone_command_is_written_at_once_and_answered(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    pipe, writes = await _pipe(client)
    try:
        future = pipe.send(pack("ECHO", "one"))
        assert writes.log == [pack("ECHO", "one")]  # before any loop turn
        assert await future == b"one"
    finally:
        await pipe.aclose()
        await client.aclose()


async def test_commands_behind_one_in_flight_go_in_one_write_without_waiting(
    redis_url: str,
) -> None:
    client = aioredis.Redis.from_url(redis_url)
    pipe, writes = await _pipe(client)
    try:
        held = pipe.send(pack("BLPOP", "q", "0"))  # its reply waits for the push below
        echoes = [pipe.send(pack("ECHO", f"e{i}")) for i in range(10)]
        assert len(writes.log) == 1
        await asyncio.sleep(0.05)
        # Written in one write while the first reply was still due: no waiting for the wire.
        assert not held.done()
        assert writes.log[1:] == [b"".join(pack("ECHO", f"e{i}") for i in range(10))]
        await client.rpush("q", "x")
        assert await held == [b"q", b"x"]
        assert await asyncio.gather(*echoes) == [f"e{i}".encode() for i in range(10)]
    finally:
        await pipe.aclose()
        await client.aclose()


async def test_an_error_reply_is_handed_back_and_the_pipe_goes_on(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    pipe, _ = await _pipe(client)
    try:
        missing = pipe.send(pack("EVALSHA", "0" * 40, "0"))
        after = pipe.send(pack("ECHO", "after"))
        assert isinstance(await missing, NoScriptError)
        assert await after == b"after"
        assert pipe.error is None
    finally:
        await pipe.aclose()
        await client.aclose()


async def test_a_caller_that_stops_waiting_leaves_its_reply_to_be_dropped(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    pipe, _ = await _pipe(client)
    try:
        await client.rpush("late", "stale")
        waiter = asyncio.ensure_future(pipe.send(pack("BLPOP", "never", "0.3")))
        await asyncio.sleep(0.05)
        waiter.cancel()
        # The next caller gets its own reply, not the one still on its way.
        assert await pipe.send(pack("LPOP", "late")) == b"stale"
        assert await pipe.send(pack("ECHO", "mine")) == b"mine"
        assert pipe.error is None
    finally:
        await pipe.aclose()
        await client.aclose()


async def test_an_overdue_reply_breaks_the_pipe_and_the_next_call_opens_another(
    redis_url: str,
) -> None:
    client = aioredis.Redis.from_url(redis_url)
    lean = LeanRedis(client, timeout_s=0.2)
    try:
        before = await _clients(client)
        await lean.pipelined(pack("PING"))
        first = lean._pipe
        assert first is not None
        held = first.send(pack("BLPOP", "never", "0"))
        behind = first.send(pack("ECHO", "behind"))
        for future in (held, behind):  # both fail: their outcome is unknown
            with pytest.raises(RedisTimeoutError):
                await future
        assert isinstance(first.error, RedisTimeoutError)
        with pytest.raises(RedisTimeoutError):
            first.send(pack("PING"))
        assert await lean.pipelined(pack("ECHO", "again")) == b"again"
        assert lean._pipe is not first
        await asyncio.sleep(0.1)
        assert await _clients(client) == before + 1  # the broken one was closed
    finally:
        await lean.aclose()
        await client.aclose()


async def test_a_lost_connection_fails_what_was_in_flight(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    lean = LeanRedis(client, timeout_s=5.0)
    try:
        conn_id = await lean.pipelined(pack("CLIENT", "ID"))
        held = asyncio.ensure_future(lean.pipelined(pack("BLPOP", "never", "0")))
        await asyncio.sleep(0.05)
        await client.client_kill_filter(_id=conn_id)
        with pytest.raises(RedisConnectionError):
            await held
        assert await lean.pipelined(pack("ECHO", "new")) == b"new"
        assert await lean.pipelined(pack("CLIENT", "ID")) != conn_id
    finally:
        await lean.aclose()
        await client.aclose()


async def test_a_reply_nobody_asked_for_breaks_the_pipe(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    lean = LeanRedis(client, timeout_s=5.0)
    try:
        await lean.pipelined(pack("MONITOR"))
        pipe = lean._pipe
        assert pipe is not None
        await client.set("seen", "by the monitor")  # a line on a connection nobody reads as such
        for _ in range(100):
            if pipe.error is not None:
                break
            await asyncio.sleep(0.01)
        assert isinstance(pipe.error, RedisConnectionError)
        assert "nobody asked for" in str(pipe.error)
    finally:
        await lean.aclose()
        await client.aclose()


async def test_concurrent_first_callers_share_one_connection(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    lean = LeanRedis(client, timeout_s=2.0)
    try:
        before = await _clients(client)
        replies = await asyncio.gather(*(lean.pipelined(pack("ECHO", f"c{i}")) for i in range(20)))
        assert replies == [f"c{i}".encode() for i in range(20)]
        assert await _clients(client) == before + 1
    finally:
        await lean.aclose()
        await client.aclose()


async def test_close_fails_what_is_in_flight_and_later_calls(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    lean = LeanRedis(client, timeout_s=5.0)
    try:
        before = await _clients(client)
        held = asyncio.ensure_future(lean.pipelined(pack("BLPOP", "never", "0")))
        await asyncio.sleep(0.05)
        await lean.aclose()
        with pytest.raises(RedisConnectionError, match="closed"):
            await held
        with pytest.raises(RuntimeError, match="closed"):
            await lean.pipelined(pack("PING"))
        await asyncio.sleep(0.1)
        assert await _clients(client) == before
    finally:
        await client.aclose()


async def test_a_reply_in_many_reads_and_many_replies_in_one_read(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    lean = LeanRedis(client, timeout_s=5.0)
    big = b"x\r\n" * 400_000  # 1.2 MB: many socket reads; CRLFs inside are data
    try:
        assert await lean.pipelined(pack("SET", "pipe:big", big)) == b"OK"
        replies = await asyncio.gather(
            lean.pipelined(pack("GET", "pipe:big")),
            *(lean.pipelined(pack("ECHO", f"e{i}")) for i in range(200)),
            lean.pipelined(pack("STRLEN", "pipe:big")),
        )
        assert replies[0] == big
        assert replies[1:-1] == [f"e{i}".encode() for i in range(200)]
        assert replies[-1] == len(big)
    finally:
        await client.delete("pipe:big")
        await lean.aclose()
        await client.aclose()
