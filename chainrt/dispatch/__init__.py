"""Dispatch of LLM steps to model backends (DESIGN §7)."""

from __future__ import annotations

from .._hooks import NO_HOOKS, Hooks
from ._backend import BackendAnswer, BackendError, LocalBackend, ModelBackend
from ._dispatcher import DispatchFailed, Dispatcher
from ._types import LlmAnswer, LlmCall, Priority

__all__ = [
    "BackendAnswer",
    "BackendError",
    "DispatchFailed",
    "Dispatcher",
    "LlmAnswer",
    "LlmCall",
    "LocalBackend",
    "ModelBackend",
    "Priority",
    "make_dispatcher",
]


def make_dispatcher(pool: str | None = None, *, hooks: Hooks = NO_HOOKS) -> Dispatcher:
    """A dispatcher for the pool file at ``pool`` (None: only the in-process ``local`` model)."""
    backends: dict[str, ModelBackend] = {"local": LocalBackend()}
    if pool is not None:
        from ._pool import load_pool_backends

        backends.update(load_pool_backends(pool, hooks=hooks))
    return Dispatcher(backends, hooks=hooks)
