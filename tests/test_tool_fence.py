"""The fleet-wide fence of a cancelled run's abandoned sync tools (``serve/_tool_fence.py``) on
one real Redis and on a real Redis Cluster: a resume waits while the owner keeps the fence (past
its TTL, renewed), goes on once the owner's last call ends or the run had none, and is not held
for ever by an owner that died."""

from __future__ import annotations

import asyncio
import threading

import pytest

from chainrt._run._tool import _in_thread
from chainrt.serve._tool_fence import ToolFence

pytestmark = pytest.mark.redis


@pytest.fixture(params=["redis", pytest.param("cluster", marks=pytest.mark.cluster)])
def url(request: pytest.FixtureRequest) -> str:
    """The session's single Redis, then the session's Redis Cluster (both flushed)."""
    found: str = request.getfixturevalue(
        "cluster_url" if request.param == "cluster" else "redis_url"
    )
    return found


async def test_a_resume_waits_for_the_owners_abandoned_call(url: str) -> None:
    owner, resumer = ToolFence(url, ttl_s=1.0), ToolFence(url, ttl_s=1.0)
    gate = threading.Event()
    try:
        await resumer.pending("r1")  # the canceller (here: the runner that resumes later)
        abandoned = _in_thread(gate.wait, {"timeout": 60}, "r1")
        owner.after_run("r1", stopped=True)
        waiting = asyncio.ensure_future(resumer.wait_clear("r1"))
        await asyncio.sleep(2.5)  # past the key's TTL: only the owner's renewals keep it
        assert not waiting.done()
        gate.set()
        await abandoned
        await asyncio.wait_for(waiting, timeout=30)
    finally:
        gate.set()
        await owner.close()
        await resumer.close()


async def test_a_stopped_run_with_no_call_left_lifts_the_fence_at_once(url: str) -> None:
    owner, resumer = ToolFence(url, ttl_s=60.0), ToolFence(url, ttl_s=60.0)
    try:
        await resumer.pending("r2")
        owner.after_run("r2", stopped=True)
        await asyncio.wait_for(resumer.wait_clear("r2"), timeout=30)  # not the 60 s TTL
    finally:
        await owner.close()
        await resumer.close()


async def test_an_owner_that_died_holds_a_resume_one_ttl_at_most(url: str) -> None:
    resumer = ToolFence(url, ttl_s=1.0)
    try:
        await resumer.pending("r4")  # its owner never says anything again
        await asyncio.wait_for(resumer.wait_clear("r4"), timeout=30)
    finally:
        await resumer.close()
