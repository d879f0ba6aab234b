"""``bench/_delay_proxy.py`` through ``bench/_redis.py``'s ``reached``: a real redis-server
behind the proxy answers every command, in order, no sooner than the delay each way allows."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from types import ModuleType

import pytest
import redis
from bench_loader import REPO, load_module

from chainrt.testing.redis_server import RedisServer

DELAY_US = 20_000
"""20 ms each way: far above any scheduling noise, so the lower bound below is the proxy's."""


def _bench_redis() -> ModuleType:
    return load_module("bench_redis", REPO / "bench" / "_redis.py")


@pytest.fixture
def proxied(redis_url: str, redis_server: RedisServer) -> Iterator[redis.Redis]:
    args = argparse.Namespace(delay_us=DELAY_US)
    with _bench_redis().reached(redis_server, args) as url:
        assert url != redis_server.url
        client = redis.Redis.from_url(url)
        try:
            yield client
        finally:
            client.close()


def test_commands_pass_through_in_order_and_no_sooner_than_the_delay(
    proxied: redis.Redis,
) -> None:
    proxied.ping()  # connect outside the timed part
    started = time.monotonic()
    assert proxied.set("proxy:k", "v") is True
    elapsed = time.monotonic() - started
    assert proxied.get("proxy:k") == b"v"
    assert elapsed >= 2 * DELAY_US / 1e6  # one round trip: the delay out and the delay back

    pipe = proxied.pipeline(transaction=False)
    for i in range(200):
        pipe.rpush("proxy:list", i)
    replies = pipe.execute()
    assert replies == list(range(1, 201))
    assert proxied.lrange("proxy:list", 0, -1) == [str(i).encode() for i in range(200)]


def test_no_delay_means_no_proxy(redis_server: RedisServer) -> None:
    args = argparse.Namespace(delay_us=0)
    with _bench_redis().reached(redis_server, args) as url:
        assert url == redis_server.url


def test_labels_say_how_the_server_was_reached() -> None:
    module = _bench_redis()
    assert "loopback" in module.delay_label(argparse.Namespace(delay_us=0))
    assert "+80 us each way" in module.delay_label(argparse.Namespace(delay_us=80))
