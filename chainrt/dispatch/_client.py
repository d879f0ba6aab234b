"""The one pooled ``httpx.AsyncClient`` a dispatcher uses for every endpoint (docs/dispatch.md).

TCP endpoints share one connection pool; Unix-socket endpoints (``unix:///run/w1.sock``) are
reached through the same client: each socket path gets a stable made-up host name, and a routing
transport sends requests for that host through an ``AsyncHTTPTransport(uds=path)``. Connections
belong to the event loop that opened them, so the client is created inside the running loop (and
replaced if the dispatcher is later used from another loop).

Building a client used to cost 25–100 ms, nearly all of it loading the CA bundle into a fresh SSL
context; paid by the first request to an endpoint, inside that request's deadline, it cut short
attempts of a few hundred ms. The SSL context is therefore built once per process
(:func:`ssl_context`, at dispatcher set-up) and every client and transport shares it, and
:meth:`ClientPool.get` is called again by ``prepare`` before a run's budget clock starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import ssl
from urllib.parse import urlsplit

import httpx

from ._credentials import TlsOptions, tls_context

__all__ = ["ClientPool", "base_url", "ssl_context"]

_UDS_DOMAIN = ".uds.chainrt.invalid"
"""``.invalid`` can never resolve (RFC 2606): a made-up host can never reach a real server."""

_LIMITS = httpx.Limits(max_connections=2000, max_keepalive_connections=500, keepalive_expiry=30)


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """The process's one verifying SSL context (loading the CA bundle is the slow part)."""
    return httpx.create_ssl_context()


def base_url(url: str) -> str:
    """The HTTP base URL requests to endpoint ``url`` are sent to.

    ``http://h:8000`` stays as it is; ``unix:///run/w1.sock`` becomes
    ``http://<hash>.uds.chainrt.invalid``, which :class:`ClientPool` routes to that socket.
    """
    if url.startswith("unix://"):
        digest = hashlib.sha1(url.encode(), usedforsecurity=False).hexdigest()[:20]
        return f"http://{digest}{_UDS_DOMAIN}"
    return url


Origin = tuple[str, int]
"""(host, port) of an ``https://`` endpoint with certificate options of its own."""


def _origin(host: str, port: int | None) -> Origin:
    return host.lower(), port or 443


class _Router(httpx.AsyncBaseTransport):
    """Sends requests for made-up UDS hosts through a socket transport, those for an origin
    with certificate options of its own through a transport using them, the rest over TCP."""

    def __init__(self, sockets: dict[str, str], tls: dict[Origin, TlsOptions]) -> None:
        self._sockets = sockets  # made-up host -> socket path (shared, grows as pools register)
        self._tls = tls  # https origin -> its certificate options (shared, like sockets)
        self._tcp = httpx.AsyncHTTPTransport(verify=ssl_context(), limits=_LIMITS)
        self._uds: dict[str, httpx.AsyncHTTPTransport] = {}
        self._own: dict[Origin, httpx.AsyncHTTPTransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if self._tls and request.url.scheme == "https":
            origin = _origin(host, request.url.port)
            options = self._tls.get(origin)
            if options is not None:
                own = self._own.get(origin)
                if own is None:
                    own = self._own[origin] = httpx.AsyncHTTPTransport(
                        verify=tls_context(options), limits=_LIMITS
                    )
                return await own.handle_async_request(request)
        if host.endswith(_UDS_DOMAIN):
            path = self._sockets.get(host)
            if path is None:
                raise httpx.ConnectError(
                    f"no Unix socket is registered for {host}", request=request
                )
            transport = self._uds.get(path)
            if transport is None:
                transport = self._uds[path] = httpx.AsyncHTTPTransport(
                    uds=path, verify=ssl_context(), limits=_LIMITS
                )
            return await transport.handle_async_request(request)
        return await self._tcp.handle_async_request(request)

    async def aclose(self) -> None:
        for transport in [self._tcp, *self._uds.values(), *self._own.values()]:
            with contextlib.suppress(Exception):
                await transport.aclose()


class ClientPool:
    """Hands out the shared client of the running event loop."""

    def __init__(self) -> None:
        self._sockets: dict[str, str] = {}
        self._tls: dict[Origin, TlsOptions] = {}
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def register(self, url: str, tls: TlsOptions | None = None) -> str:
        """Make endpoint ``url`` reachable (an ``https://`` one with certificate options
        ``tls``); returns its HTTP base URL (see :func:`base_url`). ValueError when another
        endpoint of the same host and port was registered with other certificate options."""
        base = base_url(url)
        if url.startswith("unix://"):
            self._sockets[urlsplit(base).hostname or ""] = urlsplit(url).path
        elif tls is not None and not tls.default and url.startswith("https://"):
            parts = urlsplit(url)
            origin = _origin(parts.hostname or "", parts.port)
            known = self._tls.setdefault(origin, tls)
            if known != tls:
                raise ValueError(
                    f"{origin[0]}:{origin[1]} is given two different tls settings; "
                    "one host and port is one server"
                )
        return base

    def get(self) -> httpx.AsyncClient:
        """The client of the running loop (created on first use)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            # A client left behind by another (finished) loop cannot be closed from this one;
            # its connections died with that loop.
            self._client = httpx.AsyncClient(
                transport=_Router(self._sockets, self._tls),
                verify=ssl_context(),
                timeout=60.0,
                follow_redirects=False,
            )
            self._loop = loop
        return self._client

    async def close(self) -> None:
        """Close the client (if it belongs to the running loop)."""
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.aclose()
        self._loop = None
