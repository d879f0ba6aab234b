"""JSON request bodies read with the checks ``--input`` gets (:mod:`chainrt._input_checks`).

FastAPI would parse a body with :func:`json.loads`: the last of two equal keys wins, any depth
is taken and ``"\\ud800"`` becomes a string no store can write. :class:`CheckedJSONRoute` parses
it first, refusing those with a 422 naming the field, and hands FastAPI the parsed value.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from .._input_checks import MAX_INPUT_DEPTH, find_problem, loads
from ..errors import InputError

__all__ = ["CheckedJSONRoute", "parse_body"]


def _refused(message: str, field: str | None = None) -> RequestValidationError:
    loc: tuple[str, ...] = ("body", field) if field else ("body",)
    return RequestValidationError([{"loc": loc, "msg": message, "type": "value_error"}])


def parse_body(body: bytes) -> Any:
    """A request body as JSON; RequestValidationError (a 422) for what ``--input`` refuses."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _refused(f"the body is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    try:
        value = loads(text, "the body", max_depth=MAX_INPUT_DEPTH + 1)
    except InputError as exc:
        raise _refused(exc.message) from None
    # The body object is one level above its fields: a field may nest MAX_INPUT_DEPTH levels.
    problem = find_problem(value, max_depth=MAX_INPUT_DEPTH + 1, root="")
    if problem is not None:
        field = problem.at.split(".", 1)[0].split("[", 1)[0] or None
        if problem.message.startswith("is nested deeper"):
            message = f"is nested deeper than {MAX_INPUT_DEPTH} levels"
        else:
            message = problem.message
        raise _refused(message, field)
    return value


class CheckedJSONRoute(APIRoute):
    """An APIRoute whose JSON body is parsed by :func:`parse_body` before FastAPI reads it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler, behind the body check."""
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            if request.method not in ("GET", "HEAD", "OPTIONS"):
                body = await request.body()
                if body:
                    # Request.json() returns this instead of parsing the body again.
                    request._json = parse_body(body)
            return await handler(request)

        return checked
