"""Hedged attempts (docs/dispatch.md): a second attempt when the first is slower than usual.

A step with ``llm.hedge: {after: p95}`` starts its attempt as usual. When that attempt has not
answered after the chosen percentile of its endpoint's recent answer times (or after a fixed
``after: 250ms``; or, when its endpoint is slow now — in a spike — after the time the model is
expected to need elsewhere), and what is left of the attempt's time still holds the model's usual answer
time, a second attempt goes to *another* usable endpoint of the same model. The first answer
wins; the other attempt is cancelled, which closes its HTTP connection, so a chainrt worker
stops generating for it. A failure of one of the two does not end the pair while the other runs.

No hedge without figures (an endpoint with too few recent answers), without another endpoint,
or without the time. Streaming steps hedge only until the first token: the attempt that sends a
token first owns the stream, and the other is cancelled at once (tokens cannot be taken back).

:func:`hedge_wait` is the pure decision; :class:`HedgedTry` runs the pair and
:func:`log_pair` writes both attempts to the attempt log, in attempt order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import BackendError
from ._adapt import hedge_after
from ._backend import BackendAnswer, ModelBackend, TextSink
from ._latency import LatencyTracker
from ._policy import MIN_ATTEMPT_S
from ._types import LlmCall

__all__ = ["HedgedTry", "Leg", "hedge_wait", "log_pair", "run_hedged", "wants_hedge"]

_WIND_DOWN_S = 0.05
"""How long the winner waits for the loser's cancellation (its connection closing) to finish."""

Launch = Callable[[LlmCall, frozenset[str], TextSink | None], Coroutine[Any, Any, BackendAnswer]]
"""Runs one attempt (the call's copy, endpoints to avoid, where streamed text goes)."""


def hedge_wait(
    *, after_s: float | None, waited_s: float, left_s: float, need_s: float | None
) -> float | None:
    """Seconds still to wait before the hedge starts, or None for no hedge.

    ``after_s``: the threshold, counted from the first attempt's start (None: no figures);
    ``waited_s``: how long the first attempt has run; ``left_s``: time until the attempt's end;
    ``need_s``: the model's usual answer time (None: unknown, then only the least time an
    attempt is started with). The hedge starts only if that much time is left once it starts.
    """
    if after_s is None or after_s < 0:
        return None
    wait = max(after_s - waited_s, 0.0)
    need = max(need_s if need_s is not None else 0.0, MIN_ATTEMPT_S)
    if wait + need > left_s:
        return None
    return wait


def wants_hedge(call: LlmCall, backend: ModelBackend, avoid: frozenset[str]) -> bool:
    """The step asks for hedging and the model has two endpoints outside ``avoid`` to use."""
    wanted = call.hedge_quantile is not None or call.hedge_after_ms is not None
    return wanted and backend.usable_count(avoid) >= 2


async def run_hedged(
    call: LlmCall,
    launch: Launch,
    *,
    model: str,
    backend: ModelBackend,
    latency: LatencyTracker,
    avoid: frozenset[str],
    end: float,
    slow: Callable[[str], bool] | None = None,
    other_expected_s: float | None = None,
) -> tuple[list[Leg], Leg | None]:
    """Run ``call`` on ``model``, hedged when slow: the legs and the one that answered.

    ``slow``: whether an endpoint is slow now (in a spike); the hedge of an attempt that went
    to one starts once it has run ``other_expected_s`` (the model's expected time for the
    request elsewhere), not after the endpoint's usual tail (:func:`~._adapt.hedge_after`).
    """

    def threshold(endpoint: str) -> float | None:
        if call.hedge_after_ms is not None:
            usual: float | None = call.hedge_after_ms / 1000
        else:
            assert call.hedge_quantile is not None
            key = f"{model}@{endpoint}"
            usual = latency.seconds_quantile(key, time.monotonic(), call.hedge_quantile)
        own_slow = slow is not None and slow(endpoint)
        return hedge_after(usual, own_slow=own_slow, other_expected_s=other_expected_s)

    return await HedgedTry(
        call,
        launch,
        avoid=avoid,
        end=end,
        threshold=threshold,
        need_s=latency.p50(model, time.monotonic()),
        room=lambda elsewhere: backend.usable_count(elsewhere) >= 1,
    ).run()


@dataclass(slots=True)
class Leg:
    """One attempt of a (possibly) hedged pair."""

    number: int
    """Its attempt number within the step."""
    endpoint: str | None = None
    """The endpoint it went to (told by the backend as it picks)."""
    started: float = 0.0
    """perf_counter at its start."""
    elapsed_ms: float = 0.0
    answer: BackendAnswer | None = None
    error: BackendError | None = None
    lost: bool = False
    """Cancelled because the other attempt won."""
    task: asyncio.Task[None] | None = None


class HedgedTry:
    """One attempt and, when it is slow, its hedge; :meth:`run` returns both legs."""

    def __init__(
        self,
        call: LlmCall,
        launch: Launch,
        *,
        avoid: frozenset[str],
        end: float,
        threshold: Callable[[str], float | None],
        need_s: float | None,
        room: Callable[[frozenset[str]], bool],
    ) -> None:
        self.call = call
        self.launch = launch
        self.avoid = avoid
        self.end = end
        self.threshold = threshold
        """Seconds after its start when the attempt on an endpoint counts as slow."""
        self.need_s = need_s
        self.room = room
        """Whether an endpoint outside the given ones can take a request now."""
        self.legs: list[Leg] = []
        self.owner: Leg | None = None
        """The leg whose text is streamed (the first to send any)."""
        self._picked = asyncio.Event()

    async def run(self) -> tuple[list[Leg], Leg | None]:
        """Both legs (one when no hedge started) and the one that answered (None: neither)."""
        try:
            first = self._start(self.call, self.avoid)
            await self._until_picked(first)
            await self._maybe_hedge(first)
            return self.legs, await self._race()
        finally:
            for leg in self.legs:
                if leg.task is not None and not leg.task.done():
                    leg.task.cancel()

    def _start(self, call: LlmCall, avoid: frozenset[str]) -> Leg:
        leg = Leg(number=call.attempt)

        def picked(url: str) -> None:
            leg.endpoint = url
            self._picked.set()

        copy = dataclasses.replace(call, on_endpoint=picked)
        sink = None if self.call.on_token is None else self._sink(leg)
        leg.started = time.perf_counter()
        leg.task = asyncio.ensure_future(self._body(leg, copy, avoid, sink))
        self.legs.append(leg)
        return leg

    async def _body(
        self, leg: Leg, call: LlmCall, avoid: frozenset[str], sink: TextSink | None
    ) -> None:
        try:
            leg.answer = await self.launch(call, avoid, sink)
        except BackendError as exc:
            leg.error = exc
        finally:
            leg.elapsed_ms = (time.perf_counter() - leg.started) * 1000

    def _sink(self, leg: Leg) -> TextSink:
        on_token = self.call.on_token
        assert on_token is not None

        def sink(text: str) -> None:
            if self.owner is None:
                self.owner = leg
                self._cancel_others(leg)
            if self.owner is leg:
                on_token(text)

        return sink

    async def _until_picked(self, first: Leg) -> None:
        assert first.task is not None
        waiter = asyncio.ensure_future(self._picked.wait())
        try:
            await asyncio.wait({first.task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()

    async def _maybe_hedge(self, first: Leg) -> None:
        assert first.task is not None
        if first.endpoint is None or first.task.done():
            return
        wait = hedge_wait(
            after_s=self.threshold(first.endpoint),
            waited_s=time.perf_counter() - first.started,
            left_s=self.end - time.time(),
            need_s=self.need_s,
        )
        if wait is None:
            return
        done, _ = await asyncio.wait({first.task}, timeout=wait)
        elsewhere = self.avoid | {first.endpoint}
        need = max(self.need_s or 0.0, MIN_ATTEMPT_S)
        if done or self.owner is not None or self.end - time.time() < need:
            return
        if not self.room(elsewhere):
            return
        hedge = dataclasses.replace(
            self.call, attempt=first.number + 1, not_endpoint=first.endpoint
        )
        self._start(hedge, elsewhere)

    async def _race(self) -> Leg | None:
        pending = {leg.task for leg in self.legs if leg.task is not None}
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if not task.cancelled():
                    task.result()  # a bug in an attempt is raised, not hidden
            winners = [leg for leg in self.legs if leg.answer is not None]
            if winners:
                winner = min(winners, key=lambda leg: leg.started + leg.elapsed_ms / 1000)
                losers = self._cancel_others(winner)
                if losers:
                    await asyncio.wait(losers, timeout=_WIND_DOWN_S)
                return winner
        return None

    def _cancel_others(self, keep: Leg) -> set[asyncio.Task[None]]:
        cancelled = set()
        for leg in self.legs:
            if leg is not keep and leg.task is not None and not leg.task.done():
                leg.lost = True
                leg.task.cancel()
                cancelled.add(leg.task)
        return cancelled


class LogAttempt(Protocol):
    """The dispatcher's attempt-log writer."""

    def __call__(
        self,
        status: str,
        elapsed_ms: float,
        endpoint: str | None,
        detail: str | None,
        *,
        final: bool = True,
        got: BackendAnswer | None = None,
        hedge: int | None = None,
    ) -> None: ...


def log_pair(legs: list[Leg], winner: Leg | None, log: LogAttempt) -> BackendError | None:
    """Write both legs of a hedged pair to the attempt log, in attempt order.

    Each record names the other attempt of the pair (``hedge``). The winner is ``ok``; the
    other is ``cancelled`` when it lost the race, or its own failure. When neither answered,
    the last record is left for the retry decision (``final=False``) and a failure returned
    (the second's, else the first's).
    """
    first, second = legs
    for leg, other in ((first, second), (second, first)):
        last = winner is None and leg is second
        if leg is winner:
            assert leg.answer is not None
            status = "deadline" if leg.answer.finish_reason == "deadline" else "ok"
            log(
                status,
                leg.elapsed_ms,
                leg.answer.endpoint,
                f"hedged pair: answered first (attempt {other.number} was cancelled)"
                if other.lost
                else "hedged pair: answered",
                got=leg.answer,
                hedge=other.number,
            )
        elif leg.error is not None:
            detail = f"{leg.error.message} (hedged pair with attempt {other.number})"
            log(
                leg.error.error_class,
                leg.elapsed_ms,
                leg.error.endpoint or leg.endpoint,
                detail,
                final=not last,
                hedge=other.number,
            )
        else:
            why = (
                f"hedge lost: attempt {other.number} answered first; its connection was closed"
                if winner is other
                else f"hedge lost: attempt {other.number} streamed first; its connection was closed"
            )
            log("cancelled", leg.elapsed_ms, leg.endpoint, why, final=not last, hedge=other.number)
    if winner is not None:
        return None
    return (
        second.error
        or first.error
        or BackendError("both attempts were cancelled", error_class="cancelled")
    )
