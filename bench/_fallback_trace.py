"""Where a failed step's time went, for ``bench/fallback.py``: every attempt's start and end
(wall clock), its endpoint, the spike its endpoint was in, and the fallback's queue.

:class:`SpikeLog` records when each worker's latency spike began and ended (the bench arms
them); :class:`AttemptTrace` wraps the dispatcher's backends and records each attempt of each
step with the number of attempts already in flight on the same model when it started (for the
in-process fallback: its queue). :func:`breakdown` turns a failed step into one line, and
:func:`avoidable` says whether the step's allotment could have held a healthy primary answer and
the fallback's answer behind it (the capacity measured before the modes): a failure of such a
step is dispatch's, not the load's.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from chainrt.dispatch import Dispatcher
from chainrt.errors import BackendError


@dataclass(slots=True)
class Spike:
    """One latency spike of one worker (wall-clock seconds; ``end`` None while it lasts)."""

    base: str
    start: float
    end: float | None = None


class SpikeLog:
    """The spikes armed so far."""

    def __init__(self) -> None:
        self.spikes: list[Spike] = []

    def begin(self, base: str) -> None:
        """``base``'s spike starts now."""
        self.spikes.append(Spike(base, time.time()))

    def end(self, base: str) -> None:
        """``base``'s spike ends now."""
        for spike in reversed(self.spikes):
            if spike.base == base and spike.end is None:
                spike.end = time.time()
                return

    def age_at(self, endpoint: str | None, when: float) -> float | None:
        """Seconds ``endpoint`` had been in a spike at ``when`` (negative: the spike began
        that long after ``when`` and before the attempt ended; None: no spike near)."""
        if endpoint is None:
            return None
        for spike in self.spikes:
            if spike.base != endpoint:
                continue
            end = spike.end if spike.end is not None else float("inf")
            if spike.start - 1.0 <= when < end:
                return when - spike.start
        return None


@dataclass(slots=True)
class Traced:
    """One attempt as the bench saw it."""

    model: str
    start: float
    end: float = 0.0
    endpoint: str | None = None
    status: str = "?"
    queue: int = 0
    """Attempts of the same model already in flight when this one started (for the in-process
    fallback, its queue at the moment of fallback)."""


class AttemptTrace:
    """Wraps every backend of ``dispatcher`` to record its attempts by (run id, step id)."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.by_step: dict[tuple[str, str], list[Traced]] = collections.defaultdict(list)
        self.in_flight: collections.Counter[str] = collections.Counter()
        for name in dispatcher.models:
            backend = dispatcher.backend(name)
            if backend is not None:
                backend.complete = self._wrap(name, backend.complete)  # type: ignore[method-assign]

    def _wrap(self, name: str, complete: Any) -> Any:
        async def traced(call: Any, *args: Any, **kwargs: Any) -> Any:
            entry = Traced(name, time.time(), queue=self.in_flight[name])
            self.by_step[(call.run_id, call.step_id)].append(entry)
            self.in_flight[name] += 1
            told = call.on_endpoint

            def picked(url: str) -> None:
                entry.endpoint = url
                if told is not None:
                    told(url)

            try:
                got = await complete(dataclasses.replace(call, on_endpoint=picked), *args, **kwargs)
            except BackendError as exc:
                entry.status, entry.endpoint = exc.error_class, exc.endpoint or entry.endpoint
                raise
            except BaseException:
                entry.status = "cut"  # cancelled: at its end (the dispatcher's guard), or lost
                raise
            else:
                entry.status, entry.endpoint = "ok", got.endpoint
                return got
            finally:
                entry.end = time.time()
                self.in_flight[name] -= 1

        return traced


def breakdown(entries: list[Traced], step_start: float, spikes: SpikeLog) -> str:
    """One failed step: each attempt's offset and length in ms, its endpoint's spike age at
    the attempt's start, and the queue it joined."""
    parts = []
    for e in entries:
        port = (e.endpoint or "-").rsplit(":", 1)[-1]
        age = spikes.age_at(e.endpoint, e.start)
        spike = "" if age is None else f", spike {age * 1000:+.0f}ms"
        parts.append(
            f"{e.model}@{port} {e.status} at {(e.start - step_start) * 1000:.0f}+"
            f"{(e.end - e.start) * 1000:.0f}ms (queue {e.queue}{spike})"
        )
    return " > ".join(parts)


def avoidable(allotted_ms: float, primary_s: float, fallback_s: float) -> bool:
    """Whether a step's allotment could hold a healthy primary answer and then the fallback's."""
    return allotted_ms >= (primary_s + fallback_s) * 1000
