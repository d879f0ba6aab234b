"""The fleet-wide fence of a cancelled run's abandoned sync tools (``chainrt serve`` on Redis).

A cancel abandons a sync tool in flight: Python cannot stop its thread, which runs on in the
owner's process. A resume must not start the run again (and call that tool a second time at
once) while it does. On one runner the thread count says so (``_run._tool.sync_tools_running``);
across runners this key says so::

    chainrt:tool-fence:{<run_id>}   "pending" (set by the canceller while the run had an owner)
                                    or "<pid>:<n>" (the owner's n threads still running)

The canceller sets it before it fences the owner out, for one lease TTL: the owner hears of the
cancel within that time (pub/sub, or its next lease renewal finds the lease gone). The owner,
its execution ended, deletes it when no tool of the run still runs in its process, or else
keeps it alive until the last one ends. A resume of a cancelled run waits while the key is
there; an owner that died leaves a key that expires within one lease TTL (its threads died
with it). Any Redis error while setting or reading is logged and let pass: the fence must not
stop a cancel or a resume, and the store's fencing token still keeps one writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

from .._run._tool import sync_tools_running
from ..redis.keys import fence_key

__all__ = ["ToolFence", "fence_key"]

log = logging.getLogger("chainrt.serve")

_POLL_S = 0.1


class ToolFence:
    """Sets, keeps and waits on the fence keys of one runner (see the module docstring)."""

    def __init__(self, url: str, ttl_s: float) -> None:
        self._url = url
        self.ttl_ms = max(1000, int(ttl_s * 1000))
        self._client: Any = None
        self._opening = asyncio.Lock()  # one client, however many callers ask at once
        self._holds: dict[str, asyncio.Task[None]] = {}

    async def _redis(self) -> Any:
        if self._client is not None:
            return self._client
        async with self._opening:
            if self._client is not None:
                return self._client
            import redis.asyncio as aioredis

            from ..redis import close_client, open_cluster, split_options

            url = split_options(self._url)[0]
            options: dict[str, Any] = {"socket_connect_timeout": 1.0, "socket_timeout": 5.0}
            plain = aioredis.Redis.from_url(url, **options)
            try:
                cluster = await open_cluster(url, probe=plain, **options)
            except BaseException:
                await close_client(plain)  # Redis away: asked again next time
                raise
            if cluster is not None:
                await close_client(plain)
                self._client = cluster
            else:
                self._client = plain
        return self._client

    async def pending(self, run_id: str) -> None:
        """A cancel of ``run_id`` (running, with an owner) is about to fence its owner out."""
        try:
            await (await self._redis()).set(fence_key(run_id), "pending", px=self.ttl_ms)
        except Exception as exc:
            log.warning("run %s: tool fence not set (%s); the cancel goes on", run_id, exc)

    def after_run(self, run_id: str, *, stopped: bool) -> None:
        """This runner's execution of ``run_id`` ended; ``stopped``: by a cancel or a fence.
        Keeps the fence while a tool of the run still runs here, else lifts it."""
        if run_id in self._holds:
            return
        if sync_tools_running(run_id) or stopped:
            task = asyncio.ensure_future(self._hold(run_id))
            self._holds[run_id] = task
            task.add_done_callback(lambda _: self._holds.pop(run_id, None))

    async def _hold(self, run_id: str) -> None:
        key = fence_key(run_id)
        every_s = self.ttl_ms / 3000
        warned = False
        while (threads := sync_tools_running(run_id)) > 0:
            if not warned:
                log.warning(
                    "run %s: stopped with %d sync tool call(s) still running here; "
                    "a resume waits for them",
                    run_id,
                    threads,
                )
                warned = True
            with contextlib.suppress(Exception):
                await (await self._redis()).set(key, f"{os.getpid()}:{threads}", px=self.ttl_ms)
            await asyncio.sleep(min(every_s, 0.5))
        with contextlib.suppress(Exception):
            await (await self._redis()).delete(key)

    async def wait_clear(self, run_id: str) -> None:
        """Return once no runner keeps ``run_id``'s fence (at most one lease TTL for an owner
        that died; as long as its tool runs for a live one)."""
        key = fence_key(run_id)
        warned = False
        while True:
            try:
                holder = await (await self._redis()).get(key)
            except Exception as exc:
                log.warning("run %s: tool fence not read (%s); resuming", run_id, exc)
                return
            if holder is None:
                return
            if not warned:
                log.warning(
                    "run %s: waiting for its cancelled execution's tools to end (%s) "
                    "before resuming",
                    run_id,
                    holder.decode(errors="replace") if isinstance(holder, bytes) else holder,
                )
                warned = True
            await asyncio.sleep(_POLL_S)

    async def close(self) -> None:
        """Stop keeping fences (their keys expire) and close the client."""
        for task in list(self._holds.values()):
            task.cancel()
        if self._client is not None:
            from ..redis import close_client

            await close_client(self._client)
            self._client = None
