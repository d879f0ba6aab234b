"""A warm standby vLLM engine core: built in the background, kept idle, swapped in on a death.

Building an ``AsyncLLM`` (spawning the engine core process, importing vLLM in it, loading the
weights, profiling, allocating the KV cache) is 95-97 % of a rebuild after the engine core dies:
tens of seconds on a small CPU machine. :class:`StandbyCore` builds one more ``AsyncLLM`` ahead of
time, warms it (``warm``: the serving path's first-time work, which checks it can generate too) and
keeps it idle, so that recovery is a pointer swap and the swapped-in core serves at full speed.
The cost is a second engine core: its memory (weights + KV cache + the process) for as long as the
worker runs, and the CPU of building it after start and after every swap.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from ._vllm_support import core_pid, shutdown_llm

__all__ = ["StandbyCore", "StandbyState"]

_log = logging.getLogger(__name__)

StandbyState = Literal["ready", "building", "failed", "empty"]


class StandbyCore:
    """One spare ``AsyncLLM``: :meth:`refill` builds it, :meth:`take` hands it over.

    ``build`` is blocking (it runs in a thread) and returns a new, started ``AsyncLLM``;
    ``warm`` runs the serving path's first-time work on one with a few short generations and
    raises when it cannot generate.
    """

    def __init__(self, build: Callable[[], Any], warm: Callable[[Any], Awaitable[None]]) -> None:
        self._build = build
        self._warm = warm
        self._llm: Any = None
        self._pending: Any = None  # built, not yet checked
        self._task: asyncio.Task[None] | None = None
        self._retired: set[asyncio.Task[None]] = set()  # dead cores being shut down
        self._closed = False
        self.error: str | None = None
        """Why the last build failed (None: it did not)."""
        self.builds = 0
        """Standby cores built and checked so far."""
        self.build_seconds: float | None = None
        """How long the last successful build (and its warm-up) took."""
        self.warm_seconds: float | None = None
        """How long the last successful build's warm-up took (part of :attr:`build_seconds`)."""

    @property
    def state(self) -> StandbyState:
        """``ready`` (a checked core waits), ``building``, ``failed`` (last build) or ``empty``."""
        if self._llm is not None and not self._llm.errored:
            return "ready"
        if self._task is not None and not self._task.done():
            return "building"
        return "failed" if self.error is not None else "empty"

    @property
    def pid(self) -> int | None:
        """The process id of the standby engine core (None when there is none)."""
        return core_pid(self._llm) if self._llm is not None else None

    def refill(self, delay_s: float = 0.0) -> None:
        """Build a standby core in the background, after ``delay_s``, unless one is ready or
        building."""
        if self._closed or self.state in ("ready", "building"):
            return
        self._task = asyncio.create_task(self._fill(delay_s), name="vllm-standby-build")

    async def take(self) -> Any:
        """The standby ``AsyncLLM`` (waiting for one being built); None when there is none.

        A standby still being built is waited for: whatever is left of its build is shorter
        than a whole new build.
        """
        if self._llm is None and self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
        llm, self._llm = self._llm, None
        if llm is not None and llm.errored:  # the standby core died while it waited
            _log.warning("the vLLM standby engine core is dead; discarding it")
            await shutdown_llm(llm)
            return None
        return llm

    async def swap(self, dead: Any, refill_delay_s: float) -> Any:
        """The standby ``AsyncLLM`` to serve from now on, in place of ``dead`` (None: there is
        none; a new standby starts building now, for the next death).

        ``dead`` is shut down in the background (~1 s: not on the way back) and the next standby
        starts building ``refill_delay_s`` later.
        """
        spare = await self.take()
        if spare is None:
            self.refill()
            return None
        if dead is not None:
            task = asyncio.create_task(shutdown_llm(dead), name="vllm-retire-core")
            self._retired.add(task)
            task.add_done_callback(self._retired.discard)
        del dead
        self.refill(refill_delay_s)
        return spare

    def describe(self) -> dict[str, Any]:
        """State, pid, builds, last build and warm-up times, last error (``/health/ready``)."""
        return {
            "state": self.state,
            "core_pid": self.pid,
            "builds": self.builds,
            "build_seconds": self.build_seconds,
            "warm_seconds": self.warm_seconds,
            "error": self.error,
        }

    async def close(self) -> None:
        """Stop building (waits for a build under way: a thread cannot be cancelled) and shut
        the standby core down."""
        self._closed = True
        if self._task is not None:
            await asyncio.shield(self._task)
        llm, self._llm = self._llm, None
        if llm is not None:
            await shutdown_llm(llm)
        if self._retired:
            await asyncio.gather(*self._retired, return_exceptions=True)

    async def _fill(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        if self._closed:
            return
        started = time.monotonic()
        try:
            # Straight into the attribute, as the engine does with its serving core.
            self._pending = await asyncio.to_thread(self._build)
            built = time.monotonic()
            await self._warm(self._pending)
        except Exception as exc:  # a failed standby is logged; recovery falls back to a rebuild
            self.error = f"{type(exc).__name__}: {exc}"
            _log.warning("building the vLLM standby engine core failed: %s", self.error)
            llm, self._pending = self._pending, None
            if llm is not None:
                await shutdown_llm(llm)
            return
        self._llm, self._pending = self._pending, None
        self.error = None
        self.builds += 1
        self.build_seconds = time.monotonic() - started
        self.warm_seconds = time.monotonic() - built
        _log.info(
            "vLLM standby engine core ready (pid %s) in %.2f s (warm-up %.2f s)",
            self.pid, self.build_seconds, self.warm_seconds,
        )  # fmt: skip
        if self._closed:  # the engine closed while this core was being built
            llm, self._llm = self._llm, None
            await shutdown_llm(llm)
