"""What the HTTP backends of one pool share: the client, the endpoint table, the health poller.

One :class:`PoolResources` per pool (built by :func:`~._pool.pool_backends`); every
:class:`~._http.HttpBackend` of the pool registers its endpoints with it, and the first close
stops the polling and closes the client.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._breaker import BreakerPolicy
from ._client import ClientPool, ssl_context
from ._credentials import Access
from ._endpoints import EndpointTable
from ._health import HealthPoller

__all__ = ["PoolResources"]


class PoolResources:
    """What the backends of one pool share: the client, the endpoint table, the health poller."""

    def __init__(
        self,
        policies: Mapping[str, BreakerPolicy],
        *,
        health_interval_s: float | None = 1.0,
        health_timeout_s: float = 0.5,
        connect_timeout_s: float = 1.0,
    ) -> None:
        ssl_context()  # built here, at set-up, so that no request's deadline pays for it
        self.clients = ClientPool()
        self.table = EndpointTable(policies, unready_on_connect_error=health_interval_s is not None)
        self.health = (
            None
            if health_interval_s is None
            else HealthPoller(
                self.table, self.clients, interval_s=health_interval_s, timeout_s=health_timeout_s
            )
        )
        self.connect_timeout_s = connect_timeout_s

    def register(self, url: str, access: Access | None = None) -> str:
        """Make ``url`` reachable (and polled, unless ``access`` says not); returns the HTTP
        base to send requests to."""
        access = access or Access()
        base = self.clients.register(url, access.tls)
        auth = access.auth
        if auth.api_key_env is not None or auth.headers:
            self.table.state(url).auth = auth
        if self.health is not None and access.polled:
            self.health.watch(url, base, auth)
        return base

    def start(self) -> None:
        """Start health polling in the running loop (idempotent, cheap)."""
        self.clients.get()
        if self.health is not None:
            self.health.ensure_running()

    async def close(self) -> None:
        """Stop polling and close the client (idempotent)."""
        if self.health is not None:
            await self.health.close()
        await self.clients.close()
