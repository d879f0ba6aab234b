"""The dispatcher's shared state: its backends, the requests in flight per model, recent answer
times and endpoint paces, and the estimates read from them (docs/dispatch.md).

:class:`~._dispatcher.Dispatcher` is this state plus the loop over a call's models; each model's
tries (:mod:`._model_try`) read the estimates here and record their answers and paces back.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from ._adapt import PaceBook, is_slow, memory
from ._backend import ModelBackend
from ._latency import LatencyTracker, estimate_prompt_tokens, work_units
from ._policy import NextCandidate
from ._types import LlmCall

__all__ = ["DispatchState"]


class DispatchState:
    """What every call of one dispatcher shares: backends, requests in flight, latency, paces."""

    def __init__(
        self,
        backends: Mapping[str, ModelBackend],
        *,
        latency: LatencyTracker | None = None,
    ) -> None:
        self._backends = dict(backends)
        self._in_flight: dict[str, int] = {}
        self.latency = latency or LatencyTracker()
        """Recent answer times per model and per ``model@endpoint``, with their sizes (the
        expected median decides skips and stuck cuts, the 90th percentile reserves)."""
        self.paces = PaceBook()
        """Each endpoint's last few requests and those running there: which endpoints are
        slow now (:mod:`._adapt`)."""

    def expected(self, key: str, call: LlmCall, max_tokens: int, q: float) -> float | None:
        """The ``q`` quantile of the seconds ``key`` is expected to need for ``call``."""
        return self.latency.expected(
            key,
            time.monotonic(),
            prompt_tokens=estimate_prompt_tokens(call.messages),
            max_tokens=max_tokens,
            q=q,
        )

    def usual_rate(self, model: str) -> float | None:
        """``model``'s median seconds per work unit, per request with its queue apart, as the
        endpoints' paces count them (None: too few answers)."""
        return self.paces.usual(model, time.monotonic())

    def slow_endpoints(self, model: str, call: LlmCall, max_tokens: int) -> frozenset[str]:
        """The endpoints of ``model`` that are slow now for this request (:mod:`._adapt`)."""
        now = time.monotonic()
        usual = self.usual_rate(model)
        if usual is None:
            return frozenset()
        work = work_units(estimate_prompt_tokens(call.messages), max_tokens)
        prefix = f"{model}@"
        return frozenset(
            key[len(prefix) :]
            for key in self.paces.keys(prefix)
            if is_slow(self.paces.pace(key, now, memory(usual, work), usual), usual, work)
        )

    def next_candidates(
        self, names: list[str], call: LlmCall, max_tokens: int | None = None, *, coming: int = 0
    ) -> list[NextCandidate]:
        """The fallbacks still to come (and the static answer), as the reserve sees them;
        ``coming``: attempts expected to fall back with this one (on endpoints slow now)."""
        tokens = call.max_tokens if max_tokens is None else max_tokens
        out = []
        for name in names:
            backend = self._backends.get(name)
            out.append(
                NextCandidate(
                    name,
                    self.expected(name, call, tokens, 0.5),
                    self.expected(name, call, tokens, 0.9),
                    usable=backend is not None and backend.available(),
                    in_flight=self._in_flight.get(name, 0),
                    coming=coming,
                )
            )
        if call.static_answer is not None:
            out.append(NextCandidate("static", static=True))
        return out
