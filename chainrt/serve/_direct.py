"""The two hot routes of ``chainrt serve`` answered without the framework in between:
``POST /v1/runs`` and ``GET /v1/runs/{id}`` (with ``?wait=``), the path of every served run.

A served no-op run spent more CPU in the layers between the access checks and these two handlers
(Starlette's exception and exit-stack middleware, the router's match over every route, FastAPI's
per-request parameter solving and response serialising) than in the handlers. :class:`Direct`
sits right inside :class:`~._guard.Guard` (so every access check, token scope and body limit
holds) and answers these two routes itself when the request is a plain one: a JSON object body
that parses and validates (``POST``), a ``wait`` that parses (``GET``). Anything else, a
request that would be refused included, goes on to the FastAPI app unchanged (a body already
read is handed on as it was), which answers it as it always did. Errors raised while serving
(an unknown chain, a run not found, the store away) are answered by the same function as the
app's exception handlers (:func:`._answers.failure`). The routes stay declared in the FastAPI
app: ``/openapi.json`` and a ``HEAD`` are its.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.datastructures import QueryParams
from starlette.requests import ClientDisconnect

from .._durations import parse_budget_ms, parse_duration_ms
from .._errors import ChainRTError
from ._answers import error, failure
from ._body import parse_body
from ._models import SubmitRequest
from ._service import Service

__all__ = ["MAX_WAIT_S", "Direct", "wait_seconds"]

MAX_WAIT_S = 300.0
"""The longest ``?wait=`` (a longer one waits this long)."""

_RUNS = "/v1/runs"
_RUN = "/v1/runs/"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]


class Direct:
    """ASGI middleware answering ``POST /v1/runs`` and ``GET /v1/runs/{id}`` (see the module)."""

    def __init__(self, app: Callable[..., Awaitable[None]], service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            method, path = scope["method"], scope["path"]
            if method == "POST" and path == _RUNS:
                await self._submit(scope, receive, send)
                return
            if method == "GET" and path.startswith(_RUN):
                run_id = path[len(_RUN) :]
                if run_id and "/" not in run_id and await self._get(scope, run_id, send):
                    return
        await self.app(scope, receive, send)

    async def _submit(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _whole_body(receive)
        request = self._submit_request(scope, body)
        if request is None:  # not a plain submit: the app answers it (its body handed on)
            await self.app(scope, _replay(body, receive), send)
            return
        try:
            outcome = await self.service.submit(request)
        except ChainRTError as exc:
            await failure(exc)(scope, receive, send)
            return
        run = outcome.run
        if outcome.kind == "conflict":
            answer = error(
                409,
                "run_id_conflict",
                f"run {run.run_id} exists with another chain, input or budget",
                "run_id",
            )
        else:
            accepted = {"run_id": run.run_id, "status": run.status}
            answer = JSONResponse(accepted, status_code=202 if outcome.kind == "created" else 200)
        await answer(scope, receive, send)

    def _submit_request(self, scope: Scope, body: bytes) -> SubmitRequest | None:
        """The submit ``body`` asks for, or None where the app must answer (any refusal)."""
        if not body or not _is_json(scope):
            return None
        try:
            value = parse_body(body)
            if not isinstance(value, dict):
                return None
            request = SubmitRequest.model_validate(value)
            if request.budget is not None:
                limit = self.service.config.max_budget_ms
                parse_budget_ms(request.budget, what="budget", max_ms=limit)
        except (RequestValidationError, ValidationError, ChainRTError):
            return None
        return request

    async def _get(self, scope: Scope, run_id: str, send: Send) -> bool:
        """Answer ``GET /v1/runs/{run_id}``; False (nothing sent) where the app must."""
        try:
            wait_s = wait_seconds(QueryParams(scope["query_string"]).get("wait"))
        except ChainRTError:
            return False  # the app answers the 422
        service = self.service
        try:
            body = await service.result_json(run_id, wait_s)
            if body.get("status") == "queued":
                reason = await service.waiting_reason(str(body.get("chain")))
                if reason:
                    body["reason"] = reason  # e.g. no live runner serves its chain
        except ChainRTError as exc:
            await failure(exc)(scope, _nothing, send)
            return True
        await JSONResponse(body)(scope, _nothing, send)
        return True


def wait_seconds(wait: str | None) -> float:
    """A ``?wait=`` in seconds (none: 0), at most :data:`MAX_WAIT_S`; ChainRTError for one
    that does not parse."""
    if wait is None:
        return 0.0
    return min(parse_duration_ms(wait, what="wait") / 1000, MAX_WAIT_S)


def _is_json(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            kind: bytes = value.split(b";", 1)[0].strip().lower()
            return kind == b"application/json"
    return False


async def _whole_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` with the body already read handed out first."""
    given = False

    async def replayed() -> Any:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _nothing() -> Any:
    return {"type": "http.disconnect"}
