"""The dashboard of ``chainrt serve``: ``/ui/`` (runs list) and ``/ui/runs/{run_id}`` (one run).

Static pages shipped inside the package (``chainrt/serve/ui``), no build step and nothing from a
CDN; the pages' scripts read the HTTP API (``/v1/runs``, ``/v1/runs/{id}/record``, the event
stream) and write every value from a run as text, never as HTML.

When the server has API tokens, ``/ui/login`` takes one (``POST {"token": ...}``) and answers
with an HttpOnly, SameSite=Strict cookie holding it, which the pages' requests then carry;
``POST /ui/logout`` clears it (docs/security.md).
"""

from __future__ import annotations

import json
from importlib import resources

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from ._guard import COOKIE, AccessPolicy

__all__ = ["dashboard_routes"]

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
_ASSETS = ("list.js", "run.js", "common.js", "login.js", "fleet.js", "dashboard.css")
_HEADERS = {
    # The pages load only their own scripts and styles, and talk only to this server.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def _asset(name: str) -> Response:
    body = resources.files("chainrt.serve").joinpath("ui", name).read_bytes()
    suffix = name[name.rfind(".") :]
    return Response(body, media_type=_TYPES[suffix], headers=_HEADERS)


async def _index(request: Request) -> Response:
    return _asset("index.html")


async def _run_page(request: Request) -> Response:
    return _asset("run.html")


async def _fleet_page(request: Request) -> Response:
    return _asset("fleet.html")  # loops, runs no live runner serves, dead letters


async def _static(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in _ASSETS:
        return Response("not found", status_code=404, media_type="text/plain")
    return _asset(name)


async def _login_page(request: Request) -> Response:
    return _asset("login.html")


def _refused(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status)


async def _login(request: Request) -> Response:
    # The guard has checked Host, Origin, Content-Type and the body's size already.
    policy: AccessPolicy = request.app.state.access_policy
    try:
        body = json.loads(await request.body())
    except ValueError:
        body = None
    token = body.get("token") if isinstance(body, dict) else None
    if not isinstance(token, str) or not token:
        return _refused(422, "invalid_request", 'send {"token": "..."}')
    if policy.tokens is None:
        return JSONResponse({"name": "anonymous", "cookie": False})  # nothing to log in to
    principal = policy.tokens.find(token)
    if principal is None:
        return _refused(401, "unauthorized", "the API token is not known here")
    if not principal.may("read"):
        return _refused(403, "forbidden", f"token {principal.name!r} lacks the 'read' scope")
    answer = JSONResponse({"name": principal.name, "cookie": True})
    answer.set_cookie(
        COOKIE,
        token,
        httponly=True,  # no script reads it, an injected one included
        samesite="strict",  # other sites' pages never send it
        secure=request.url.scheme == "https",
        path="/",
    )
    return answer


async def _logout(request: Request) -> Response:
    answer = JSONResponse({"cookie": False})
    answer.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return answer


async def _to_index(request: Request) -> Response:
    return RedirectResponse("/ui/", status_code=307)


def dashboard_routes() -> list[BaseRoute]:
    """The dashboard's routes, for ``create_app(service, routes=...)``."""
    return [
        Route("/ui", _to_index, methods=["GET"]),
        Route("/ui/", _index, methods=["GET"]),
        Route("/ui/login", _login_page, methods=["GET"]),
        Route("/ui/login", _login, methods=["POST"]),
        Route("/ui/logout", _logout, methods=["POST"]),
        Route("/ui/runs/{run_id}", _run_page, methods=["GET"]),
        Route("/ui/fleet", _fleet_page, methods=["GET"]),
        Route("/ui/static/{name}", _static, methods=["GET"]),
    ]
