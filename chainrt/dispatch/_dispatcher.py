"""The dispatch loop: primary, retries and fallbacks, all inside the step's deadline (docs/dispatch.md).

For each model in ``[call.model, *call.fallbacks]`` the loop asks the pure functions of
:mod:`._policy` and :mod:`._latency` what to do — skip the model (no usable endpoint, or its
expected median for this request's size cannot fit the time left), when to cut this attempt
(keeping the next fallback's expected time in reserve: measured at load for the in-process model,
then refreshed by its answers), and after a failure whether a retry fits (tenacity drives the retries, the decision is
:func:`~._policy.decide_retry`). It only awaits backends and sleeps. Every attempt lands in the
attempt log with its endpoint, status, milliseconds and why the loop moved on; the static answer,
when the step has one, closes the list.
"""

from __future__ import annotations

from .._records import AttemptRecord
from ..errors import DispatchFailed
from ._backend import ModelBackend
from ._latency import estimate_prompt_tokens
from ._model_try import ModelTry
from ._outcome import no_answer, skip, static_answer
from ._policy import MIN_ATTEMPT_S, fit_context
from ._state import DispatchState
from ._types import LlmAnswer, LlmCall

__all__ = ["MIN_ATTEMPT_S", "DispatchFailed", "Dispatcher"]


class Dispatcher(DispatchState):
    """Sends LLM calls to model backends, with retries and fallbacks inside a deadline.

    Its shared state — backends, requests in flight, ``latency``, ``paces`` and the estimates
    read from them (:meth:`expected`, :meth:`usual_rate`, :meth:`slow_endpoints`,
    :meth:`next_candidates`) — is :class:`~._state.DispatchState`'s; each model's tries are a
    :class:`~._model_try.ModelTry`.
    """

    @property
    def models(self) -> list[str]:
        """Model names this dispatcher knows."""
        return sorted(self._backends)

    def backend(self, model: str) -> ModelBackend | None:
        """The backend serving ``model`` (None when unknown)."""
        return self._backends.get(model)

    async def complete(self, call: LlmCall, deadline: float) -> LlmAnswer:
        """Answer ``call`` before ``deadline`` (unix seconds) or raise DispatchFailed.

        NoEndpoint (a DispatchFailed) when no model of the call had an endpoint to try at all.
        """
        attempts: list[AttemptRecord] = []
        answer, tried = await self._through(call, [call.model, *call.fallbacks], deadline, attempts)
        if answer is not None:
            return answer
        if call.static_answer is not None:
            return static_answer(call, attempts)
        raise no_answer(call, attempts, tried=tried)

    async def _through(
        self,
        call: LlmCall,
        order: list[str],
        deadline: float,
        attempts: list[AttemptRecord],
        *,
        beside: bool = False,
    ) -> tuple[LlmAnswer | None, bool]:
        """Try the models of ``order`` in turn: the answer (None: none) and whether any model
        was tried. ``beside``: these are fallbacks started beside a running attempt."""
        tried = False
        for index, model in enumerate(order):
            backend = self._backends.get(model)
            if backend is None:
                skip(
                    call, attempts, model, f"model {model!r} is not in the pool (add it to --pool)"
                )
                continue
            if not backend.available():
                skip(call, attempts, model, backend.why_unavailable())
                continue
            fit = fit_context(
                estimate_prompt_tokens(call.messages),
                call.max_tokens,
                backend.context_window(),
                shrink=call.shrink_on_memory_pressure,
            )
            if fit.max_tokens is None:
                skip(call, attempts, model, fit.why or "request does not fit")
                continue
            tried = True
            model_try = ModelTry(
                self,
                self._through,
                call,
                model,
                backend,
                order[index + 1 :],
                deadline,
                attempts,
                fit,
            )
            model_try.beside = beside
            answer = await model_try.run()
            if answer is not None:
                return answer, True
            if model_try.rest_tried:  # the fallbacks ran beside it and did not answer either
                return None, True
        return None, tried

    async def prepare(self, models: list[str]) -> None:
        """Get the backends of ``models`` ready (e.g. load the in-process model) ahead of a run."""
        for model in models:
            backend = self._backends.get(model)
            if backend is not None:
                await backend.prepare()
                if not self.latency.has_baseline(model):
                    baseline = backend.baseline()
                    if baseline:
                        self.latency.set_baseline(model, baseline)

    async def close(self) -> None:
        """Close every backend."""
        for backend in self._backends.values():
            await backend.close()
