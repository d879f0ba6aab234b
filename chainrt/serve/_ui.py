"""The dashboard of ``chainrt serve``: ``/ui/`` (runs list) and ``/ui/runs/{run_id}`` (one run).

Static pages shipped inside the package (``chainrt/serve/ui``), no build step and nothing from a
CDN; the pages' scripts read the HTTP API (``/v1/runs``, ``/v1/runs/{id}/record``, the event
stream) and write every value from a run as text, never as HTML.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

__all__ = ["dashboard_routes"]

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
_ASSETS = ("list.js", "run.js", "common.js", "dashboard.css")
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


async def _static(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in _ASSETS:
        return Response("not found", status_code=404, media_type="text/plain")
    return _asset(name)


async def _to_index(request: Request) -> Response:
    return RedirectResponse("/ui/", status_code=307)


def dashboard_routes() -> list[BaseRoute]:
    """The dashboard's routes, for ``create_app(service, routes=...)``."""
    return [
        Route("/ui", _to_index, methods=["GET"]),
        Route("/ui/", _index, methods=["GET"]),
        Route("/ui/runs/{run_id}", _run_page, methods=["GET"]),
        Route("/ui/static/{name}", _static, methods=["GET"]),
    ]
