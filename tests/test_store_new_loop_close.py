"""A Redis store used from one event loop after another (``asyncio.run`` per call, as a
script's sync wrapper does), then closed from yet another, leaves no connection open: each
loop's connections are closed when that loop shuts down, not left to the garbage collector
(whose ResourceWarning pytest turns into the failure of whichever test runs then)."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest

from chainrt.store import RedisStore
from chainrt.testing.store_conformance import make_run

pytestmark = [pytest.mark.redis]


def _left_open() -> list[str]:
    """The ResourceWarnings the collector gives now (unclosed nodes, connections, sockets)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


def _use_from_new_loops(url: str) -> None:
    store = RedisStore(url)
    for i in range(3):  # three loops, each closed by asyncio.run before the next one
        asyncio.run(store.create_run(make_run(f"loop-{i}")))
    assert len(asyncio.run(store.list_runs(limit=10))) == 3
    asyncio.run(store.close())  # from a loop of its own too
    del store


def test_a_store_used_from_new_loops_leaves_nothing_open(redis_url: str) -> None:
    assert _left_open() == []  # nothing of an earlier test is counted here
    _use_from_new_loops(redis_url)
    assert _left_open() == []


@pytest.mark.cluster
def test_a_cluster_store_used_from_new_loops_leaves_nothing_open(cluster_url: str) -> None:
    assert _left_open() == []
    _use_from_new_loops(cluster_url)
    assert _left_open() == []
