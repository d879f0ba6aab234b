"""Background polling of every endpoint's readiness, with short timeouts (docs/dispatch.md).

chainrt workers answer ``GET /health/ready`` with 200 only while their last real generation
passed (503 while starting or recovering from an OOM). A plain vLLM OpenAI server has no such
route: on a 404 the poller switches that endpoint to vLLM's ``GET /health`` for good. A poll that
fails to connect or runs past its timeout marks the endpoint not ready; the next good poll marks
it ready again.

The poller starts lazily with the first request, inside the running loop, and stops with
:meth:`HealthPoller.close` (the dispatcher's ``close``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import httpx

from ._client import ClientPool
from ._credentials import EndpointAuth
from ._endpoints import EndpointTable

__all__ = ["HealthPoller"]

log = logging.getLogger("chainrt.dispatch")

READY_PATH = "/health/ready"
PLAIN_PATH = "/health"
"""vLLM's own health route (200 while its engine lives)."""


class HealthPoller:
    """Polls each registered endpoint every ``interval_s`` seconds."""

    def __init__(
        self, table: EndpointTable, clients: ClientPool, *, interval_s: float, timeout_s: float
    ) -> None:
        self._table = table
        self._clients = clients
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._bases: dict[str, str] = {}
        self._paths: dict[str, str] = {}
        self._auth: dict[str, EndpointAuth] = {}
        self._task: asyncio.Task[None] | None = None
        self.polls = 0
        """Completed polling rounds (for tests and diagnostics)."""

    def watch(self, url: str, base: str, auth: EndpointAuth | None = None) -> None:
        """Poll endpoint ``url`` (reached at HTTP ``base``; ``auth``: its key and headers go
        with each poll, a gateway may ask for them)."""
        self._bases[url] = base
        if auth is not None:
            self._auth[url] = auth

    def ensure_running(self) -> None:
        """Start polling in the running loop unless it already runs there."""
        task = self._task
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            return
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="chainrt-health-poller"
        )

    async def close(self) -> None:
        """Stop polling."""
        task, self._task = self._task, None
        if task is None or task.done():
            return
        if task.get_loop() is not asyncio.get_running_loop():
            return  # its loop is gone with it
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:  # a bug here must not stop polling for good
                log.exception("health polling failed")
            await asyncio.sleep(self.interval_s)

    async def poll_once(self) -> None:
        """Poll every endpoint once, concurrently; update their readiness."""
        urls = list(self._bases)
        results = await asyncio.gather(*(self._check(url) for url in urls))
        for url, (ready, detail) in zip(urls, results, strict=True):
            state = self._table.state(url)
            if state.ready is not ready:
                log.info("endpoint %s is %s", url, "ready" if ready else f"not ready: {detail}")
            state.ready = ready
            state.ready_detail = detail
        self.polls += 1

    async def _check(self, url: str) -> tuple[bool, str | None]:
        client = self._clients.get()
        path = self._paths.get(url, READY_PATH)
        auth = self._auth.get(url)
        headers = None if auth is None else auth.request_headers()
        try:
            response = await client.get(
                self._bases[url] + path, timeout=self.timeout_s, headers=headers
            )
            if response.status_code == 404 and path == READY_PATH:
                self._paths[url] = PLAIN_PATH  # not a chainrt worker: use vLLM's route
                response = await client.get(
                    self._bases[url] + PLAIN_PATH, timeout=self.timeout_s, headers=headers
                )
        except httpx.TimeoutException:
            return False, f"health check took over {self.timeout_s * 1000:.0f}ms"
        except httpx.HTTPError as exc:
            return False, f"health check failed: {type(exc).__name__}"
        if response.status_code == 200:
            return True, None
        return False, f"{path} answered {response.status_code}"
