"""Pub/sub on a bare connection (chainrt/redis/_subscription.py), against a real redis-server:
messages and confirmations reach the owner whatever protocol the URL asks for, a password is
sent as the client's, and a Redis that stops answering is found out by the probe."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from chainrt.redis._subscription import BareSubscription
from chainrt.testing.redis_server import RedisServer


@pytest.fixture
def private() -> Iterator[RedisServer]:
    with RedisServer(password="s3cret") as server:
        yield server


async def _heard(got: list[Any], n: int) -> None:
    for _ in range(500):
        if len(got) >= n:
            return
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("protocol", [2, 3])
async def test_messages_and_confirmations_reach_the_owner(
    private: RedisServer, protocol: int
) -> None:
    client = aioredis.Redis.from_url(private.url, protocol=protocol)
    got: list[tuple[bytes, bytes, Any]] = []
    sub = await BareSubscription.open(client, lambda *m: got.append(m))
    try:
        sub.subscribe("a", "b")
        await _heard(got, 2)
        assert got == [(b"subscribe", b"a", 1), (b"subscribe", b"b", 2)]
        await client.publish("a", b"one")
        await client.publish("b", "two \u00e9".encode())
        await client.publish("c", b"never")  # not subscribed
        await _heard(got, 4)
        sub.unsubscribe("a")
        await client.publish("a", b"gone")
        await client.publish("b", b"three")
        await _heard(got, 6)
        assert got[2:] == [
            (b"message", b"a", b"one"),
            (b"message", b"b", "two \u00e9".encode()),
            (b"unsubscribe", b"a", 1),
            (b"message", b"b", b"three"),
        ]
    finally:
        await sub.aclose()
        await client.aclose()
    assert isinstance(await sub.lost(), Exception)


async def test_a_redis_that_stops_answering_is_found_out_by_the_probe(
    private: RedisServer,
) -> None:
    client = aioredis.Redis.from_url(private.url)
    # A probe period a loaded machine's stalls stay well under (a PONG late by a whole period
    # would read as a silent Redis).
    sub = await BareSubscription.open(client, lambda *m: None, probe_s=1.5)
    assert private.process is not None
    try:
        sub.subscribe("a")
        await asyncio.sleep(4.0)  # quiet but answering its PINGs: not lost
        assert not sub._lost.done()
        os.kill(private.process.pid, signal.SIGSTOP)
        began = time.monotonic()
        why = await asyncio.wait_for(sub.lost(), 30)
        assert "no answer on pub/sub" in str(why)
        assert time.monotonic() - began < 25  # 2-3 probe periods (4.5 s); loaded machines stall
    finally:
        os.kill(private.process.pid, signal.SIGCONT)
        await sub.aclose()
        await client.aclose()
