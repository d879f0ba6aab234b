"""The live events of the runs this process executes, kept until their step is recorded.

A run's recorded history (its run and step records) holds every finished step, but not the step
in flight: its ``step_started`` and the attempts and tokens so far exist only as live events. A
watcher that connects in the middle of a step gets them from here (in process) or from the run's
owner through Redis (``chainrt:events-replay``). What a step's record holds is dropped once the
step finishes; everything of a run once it ends.
"""

from __future__ import annotations

import json

from .._events import RunEvent

__all__ = ["KEEP_PER_RUN", "InFlight", "event_key"]

KEEP_PER_RUN = 2000
"""Most events kept per run (a long generation's tokens past this are not kept)."""


def event_key(event: RunEvent) -> str:
    """What tells one event from another: its JSON, keys sorted (an event replayed, or heard
    through Redis, is the same event sent again; its time stamp tells it from a like one)."""
    return json.dumps(event.to_dict(), sort_keys=True, default=str)


class InFlight:
    """A runtime event sink: per run, ``run_started`` and the events of its steps in flight.

    Events are kept as they come, in order (the runtime emits each once); what tells one from
    another (:func:`event_key`) is computed by the watcher that reads them, not here, for every
    event of every run."""

    def __init__(self) -> None:
        self._runs: dict[str, list[RunEvent]] = {}

    def observe(self, event: RunEvent) -> None:
        """Keep ``event`` while its step (or run) is not recorded yet."""
        kind = event.type
        if kind == "run_finished":
            self._runs.pop(event.run_id, None)
            return
        if kind == "run_started":
            self._runs[event.run_id] = []
        kept = self._runs.get(event.run_id)
        if kept is None:
            return  # a run that started before this sink was added
        if kind == "step_started" and kept:
            # Steps finished before this one started are recorded by now (a step is committed
            # before the next one starts): the history tells them, their events go.
            done = {e.step_id for e in kept if e.type == "step_finished"}
            if done:
                kept[:] = [e for e in kept if e.step_id not in done]
        if len(kept) < KEEP_PER_RUN:
            kept.append(event)

    def events(self, run_id: str) -> list[RunEvent] | None:
        """The kept events of ``run_id``, oldest first; None when this process does not run it."""
        kept = self._runs.get(run_id)
        return None if kept is None else list(kept)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._runs
