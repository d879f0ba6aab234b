"""The error answers of ``chainrt serve``'s API: one JSON shape, ``{"error": {"type",
"message", "field"?}}``, and which status each of chainrt's errors gets. The app's exception
handlers (:mod:`._app`) and its direct routes (:mod:`._direct`) answer through here alike."""

from __future__ import annotations

import re

from fastapi.responses import JSONResponse

from .._errors import ChainRTError, CheckpointError, InputError, RunNotFound, StoreUnavailable
from ._service import UnknownChain

__all__ = ["error", "failure", "snake"]


def snake(name: str) -> str:
    """``CheckpointError`` → ``checkpoint_error``: every error type of the API in one case."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def error(status: int, kind: str, message: str, field: str | None = None) -> JSONResponse:
    """The error answer: ``status`` with ``{"error": {"type": kind, "message", "field"?}}``."""
    body: dict[str, str] = {"type": kind, "message": message}
    if field is not None:
        body["field"] = field
    return JSONResponse({"error": body}, status_code=status)


def failure(exc: ChainRTError) -> JSONResponse:
    """The answer to a chainrt error raised while serving a request: 404 for an unknown run or
    chain, 422 for input the chain refuses, 503 with the store away, 409 for a checkpoint
    conflict (e.g. resuming a completed run), else 500."""
    if isinstance(exc, RunNotFound):
        return error(404, "run_not_found", exc.message)
    if isinstance(exc, UnknownChain):
        return error(404, "chain_not_found", exc.message, "chain")
    if isinstance(exc, InputError):
        return error(422, "invalid_input", exc.message, "input")
    if isinstance(exc, StoreUnavailable):
        status = 503
    elif isinstance(exc, CheckpointError):
        status = 409
    else:
        status = 500
    return error(status, snake(type(exc).__name__), exc.message)
