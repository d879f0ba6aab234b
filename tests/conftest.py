"""Shared fixtures: a private redis-server per test session, flushed per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.register_assert_rewrite("chainrt.testing")

from chainrt.testing.redis_server import RedisServer  # noqa: E402  (after assert rewrite)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A redis-server started for this test session on a free port."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the session's redis-server, flushed before each test."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture
def chainrt_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test with a fresh working directory (so `.chainrt/` lands in a temp dir)."""
    monkeypatch.chdir(str(tmp_path))
    return os.fspath(tmp_path)
