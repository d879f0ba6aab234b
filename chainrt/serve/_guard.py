"""The checks every request to ``chainrt serve`` passes before the app sees it
(see docs/security.md).

- ``Host`` must be an allowed name (loopback names, ``--allowed-host``): a page whose DNS name
  is rebound to this server's address still sends its own name, and is refused.
- A state-changing request (anything but GET/HEAD/OPTIONS) must say
  ``Content-Type: application/json`` (a cross-site ``<form>`` or ``fetch(..., {mode:
  "no-cors"})`` cannot) and carry no ``Origin`` but the server's own; ``Sec-Fetch-Site:
  cross-site`` is refused too.
- A body over ``--max-body`` is a 413: by its ``Content-Length`` before a byte is read, or, sent
  in chunks, as soon as the count passes the limit.
- With tokens configured, the request's token (``Authorization: Bearer``, or the dashboard's
  cookie) must hold the scope :func:`~chainrt.serve._auth.required_scope` names: 401 without
  a valid token, 403 without the scope.

:func:`check_request` decides (pure, table-tested); :class:`Guard` is the thin ASGI driver.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import ClientDisconnect, Request, cookie_parser

from .._api_tokens import ANONYMOUS, Principal, Scope, TokenTable, required_scope

__all__ = [
    "COOKIE",
    "DEFAULT_MAX_BODY",
    "LOOPBACK_NAMES",
    "AccessPolicy",
    "Guard",
    "Refusal",
    "check_request",
    "host_name",
    "is_loopback",
    "requires",
]

COOKIE = "chainrt_token"
"""The dashboard's cookie (HttpOnly, SameSite=Strict): the token it logged in with."""

DEFAULT_MAX_BODY = 4 * 1024 * 1024
"""Largest request body accepted by default (``--max-body``)."""

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
"""Host names always allowed: no other site's page can send them as its own name."""

_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})

ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


@dataclass(frozen=True)
class AccessPolicy:
    """What :func:`check_request` enforces. ``tokens`` None: no tokens, everyone may do
    everything (``chainrt serve`` allows that on loopback only)."""

    tokens: TokenTable | None = None
    allowed_hosts: frozenset[str] = LOOPBACK_NAMES
    max_body: int = DEFAULT_MAX_BODY

    @classmethod
    def build(
        cls, tokens: TokenTable | None, hosts: Iterable[str], max_body: int = DEFAULT_MAX_BODY
    ) -> AccessPolicy:
        """Loopback names plus ``hosts`` (``*`` allows any name)."""
        names = {h.strip().lower().strip("[]") for h in hosts if h.strip()}
        return cls(tokens, LOOPBACK_NAMES | frozenset(names), max_body)


@dataclass(frozen=True)
class Refusal:
    """A request refused: the status and the error body's type and message."""

    status: int
    kind: str
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)

    def body(self) -> bytes:
        """The JSON error body, in the API's one shape."""
        return json.dumps({"error": {"type": self.kind, "message": self.message}}).encode()


def host_name(host: str) -> str:
    """The name in a ``Host`` header, lowercased, without port or IPv6 brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    name, _, port = host.rpartition(":")
    return name if name and port.isdigit() else host


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` reaches this machine only."""
    if host_name(host) == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_json(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


def _origin_ok(origin: str | None, host: str) -> bool:
    if origin is None:
        return True  # not a browser, or a same-origin navigation that sends none
    scheme, sep, rest = origin.partition("://")
    # The origin's host and port must be the Host this request was sent to (whatever scheme a
    # proxy in front terminated): any other site's page sends its own.
    return bool(sep) and scheme in ("http", "https") and rest.lower() == host.strip().lower()


def _token(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("authorization")
    if auth is not None:
        kind, _, value = auth.partition(" ")
        return value.strip() if kind.lower() == "bearer" and value.strip() else ""
    cookie = headers.get("cookie")
    if cookie:
        return cookie_parser(cookie).get(COOKIE)
    return None


def check_request(
    method: str, path: str, headers: Mapping[str, str], policy: AccessPolicy
) -> Refusal | Principal:
    """The refusal for a request, or who made it. ``headers``: lowercase names."""
    host = headers.get("host", "")
    checked = not path.startswith("/health/") and "*" not in policy.allowed_hosts
    if checked and host_name(host) not in policy.allowed_hosts:
        return Refusal(
            421,
            "host_not_allowed",
            f"Host {host[:100]!r} is not served here (chainrt serve --allowed-host NAME)",
        )
    if method.upper() not in _SAFE:
        origin = headers.get("origin")
        if not _origin_ok(origin, host) or headers.get("sec-fetch-site") == "cross-site":
            return Refusal(403, "cross_origin", "requests from other sites' pages are refused")
        if not _is_json(headers.get("content-type", "")):
            return Refusal(
                415,
                "unsupported_media_type",
                "send the request with Content-Type: application/json",
            )
    length = headers.get("content-length")
    if length is not None:
        if not length.strip().isdigit():
            return Refusal(400, "invalid_request", "Content-Length is not a number")
        if int(length) > policy.max_body:
            return _too_large(policy.max_body)
    scope = required_scope(method, path)
    if scope is None or policy.tokens is None:
        return ANONYMOUS
    token = _token(headers)
    if not token:
        return Refusal(
            401,
            "unauthorized",
            "this server needs an API token: Authorization: Bearer TOKEN",
            {"WWW-Authenticate": "Bearer"},
        )
    principal = policy.tokens.find(token)
    if principal is None:
        return Refusal(
            401, "unauthorized", "the API token is not known here", {"WWW-Authenticate": "Bearer"}
        )
    if not principal.may(scope):
        return Refusal(403, "forbidden", f"token {principal.name!r} lacks the {scope!r} scope")
    return principal


def _too_large(limit: int) -> Refusal:
    return Refusal(
        413,
        "body_too_large",
        f"the request body is larger than {limit} bytes (chainrt serve --max-body)",
        {"Connection": "close"},
    )


class _BodyTooLarge(Exception):
    pass


class _Denied(Exception):
    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def requires(scope: Scope) -> Callable[[Request], None]:
    """A FastAPI dependency for a route that needs ``scope`` beyond what
    :func:`required_scope` names for its path: ``dependencies=[Depends(requires("admin"))]``."""

    def check(request: Request) -> None:
        principal = request.scope.get("state", {}).get("principal", ANONYMOUS)
        if not principal.may(scope):
            raise _Denied(
                Refusal(403, "forbidden", f"token {principal.name!r} lacks the {scope!r} scope")
            )

    return check


async def _send_refusal(send: Callable[[Any], Awaitable[None]], refusal: Refusal) -> None:
    body = refusal.body()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    headers += [(k.lower().encode(), v.encode()) for k, v in refusal.headers.items()]
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI middleware applying :func:`check_request` to every HTTP request."""

    def __init__(self, app: ASGIApp, policy: AccessPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        decided = check_request(scope["method"], scope["path"], headers, self.policy)
        if isinstance(decided, Refusal):
            await _send_refusal(send, decided)
            return
        scope.setdefault("state", {})["principal"] = decided
        limit = self.policy.max_body
        seen = 0
        started = False

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _BodyTooLarge
            return message

        async def tracked(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except ClientDisconnect:
            pass  # the client left (or was dropped: --body-timeout) before its body was in
        except _BodyTooLarge:
            if not started:
                await _send_refusal(send, _too_large(limit))
        except _Denied as exc:
            if not started:
                await _send_refusal(send, exc.refusal)
