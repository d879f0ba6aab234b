"""``llm.dispatch`` spans: a model backend wrapped so that each attempt is a CLIENT span.

One of the interceptors of :mod:`._intercept`, in a module of its own:
:func:`chainrt.dispatch.make_dispatcher` wraps its backends here, and this module imports nothing
of the runner, so dispatch and the runner's interceptor do not import each other in a circle.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from .._hooks import Hooks
from .._redact import redact_text
from ..dispatch._backend import BackendAnswer, BackendError, ModelBackend, TextSink
from ..dispatch._hops import answer_hops
from ..dispatch._latency import Sample
from ..dispatch._types import LlmCall
from . import _attributes as attr

__all__ = ["TracedBackend", "delegate", "trace_backends"]


class TracedBackend(ModelBackend):
    """A model backend whose attempts are ``llm.dispatch`` CLIENT spans.

    The attempt's call goes on with the span's ``traceparent``, so the worker's server span is
    the attempt's child. The span tells what the backend returned (endpoint, tokens, ``ok`` or
    ``deadline``) or how it failed; the dispatcher's verdict on the answer's content (a JSON
    step's invalid output) is in the step's attempt log.
    """

    def __init__(self, inner: ModelBackend, hooks: Hooks) -> None:
        self.inner = inner
        self.hooks = hooks

    async def complete(
        self,
        call: LlmCall,
        model: str,
        max_tokens: int,
        deadline: float,
        *,
        avoid: frozenset[str] = frozenset(),
        on_text: TextSink | None = None,
    ) -> BackendAnswer:
        """One attempt inside its span."""
        attributes = {
            attr.RUN_ID: call.run_id,
            attr.STEP_ID: call.step_id,
            attr.MODEL: model,
            attr.ATTEMPT: call.attempt,
            # Same meaning as on chain.step: the fallback model's name, absent on the primary.
            attr.FALLBACK: model if model != call.model else None,
            attr.GEN_AI_REQUEST_MODEL: model,
            attr.ATTEMPT_MS: round((deadline - time.time()) * 1000, 3),
            attr.GEN_AI_REQUEST_MAX_TOKENS: max_tokens,
            attr.HEDGE: True if call.not_endpoint is not None else None,
        }
        started = time.perf_counter()
        with self.hooks.span(attr.SPAN_DISPATCH, attributes) as span:
            traceparent = self.hooks.traceparent() or call.traceparent
            call = dataclasses.replace(call, traceparent=traceparent)
            try:
                got = await self.inner.complete(
                    call, model, max_tokens, deadline, avoid=avoid, on_text=on_text
                )
            except BackendError as exc:
                span.error(exc)
                endpoint = redact_text(exc.endpoint) if exc.endpoint else exc.endpoint
                span.set(**{attr.ENDPOINT: endpoint, attr.STATUS: exc.error_class})
                raise
            except asyncio.CancelledError:  # a hedge's loser, or the step was cancelled
                span.set(**{attr.STATUS: "cancelled"})
                raise
            span.set(
                **{
                    attr.ENDPOINT: redact_text(got.endpoint) if got.endpoint else got.endpoint,
                    attr.STATUS: "deadline" if got.finish_reason == "deadline" else "ok",
                    attr.GEN_AI_USAGE_INPUT_TOKENS: got.prompt_tokens,
                    attr.GEN_AI_USAGE_OUTPUT_TOKENS: got.completion_tokens,
                    attr.TOKENS_CACHED: got.cached_tokens,
                    attr.COST: got.cost,
                }
            )
            hops = answer_hops(got, (time.perf_counter() - started) * 1000)
            span.set(
                **{attr.CONFIDENCE: hops["confidence"]},
                **{attr.HOP_PREFIX + name: ms for name, ms in (hops["hops_ms"] or {}).items()},
            )
        return got

    def available(self) -> bool:
        """Passed through."""
        return self.inner.available()

    def usable_elsewhere(self, avoid: frozenset[str]) -> bool:
        """Passed through."""
        return self.inner.usable_elsewhere(avoid)

    def usable_count(self, avoid: frozenset[str]) -> int:
        """Passed through."""
        return self.inner.usable_count(avoid)

    def why_unavailable(self) -> str:
        """Passed through."""
        return self.inner.why_unavailable()

    async def prepare(self) -> None:
        """Passed through."""
        await self.inner.prepare()

    def baseline(self) -> tuple[Sample, ...]:
        """Passed through."""
        return self.inner.baseline()

    def context_window(self) -> int | None:
        """Passed through."""
        return self.inner.context_window()

    async def close(self) -> None:
        """Passed through."""
        await self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return delegate(self, name)


def delegate(wrapper: Any, name: str) -> Any:
    """``wrapper.inner``'s attribute ``name``: what a traced part does not wrap, it passes on."""
    if name == "inner":  # not set yet (a half-built copy): never recurse
        raise AttributeError(name)
    return getattr(wrapper.inner, name)


def trace_backends(backends: Mapping[str, ModelBackend], hooks: Hooks) -> dict[str, ModelBackend]:
    """Every backend of ``backends`` wrapped in a :class:`TracedBackend`."""
    return {name: TracedBackend(backend, hooks) for name, backend in backends.items()}
