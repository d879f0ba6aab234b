"""How many answers a second the fallback benchmark's engines give, measured in the same run.

``bench/fallback.py`` prints this before its modes, so that a figure can be read against the load
it was offered: the healthy primary worker alone, the in-process local model alone, and both at
once (they share the machine's cores), each answering the benchmark's own request one at a time.
:func:`headroom` compares that with what the run offers: ``concurrency`` chains whose requests
may all queue on one engine.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx

from chainrt.engines import ChatMessage, GenerationRequest, get_local_engine

__all__ = ["Capacity", "headroom", "measure"]


@dataclass(frozen=True, slots=True)
class Capacity:
    """Seconds per answer (mean) of each engine alone and of each while the other also runs."""

    primary_s: float
    local_s: float
    primary_shared_s: float
    local_shared_s: float

    @property
    def shared_per_s(self) -> float:
        """Answers a second of both engines together, each answering one request at a time."""
        return 1 / self.primary_shared_s + 1 / self.local_shared_s

    def describe(self) -> str:
        """One line per measurement, in answers a second and ms per answer."""

        def rate(seconds: float) -> str:
            return f"{1 / seconds:5.2f} answers/s ({seconds * 1000:.0f} ms each)"

        return (
            f"capacity: healthy primary alone {rate(self.primary_s)}; local alone "
            f"{rate(self.local_s)};\n          both at once: primary {rate(self.primary_shared_s)}"
            f" + local {rate(self.local_shared_s)} = {self.shared_per_s:.2f} answers/s"
        )


async def _primary(base: str, prompt: str, max_tokens: int, count: int) -> float:
    body = {
        "model": "smol",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    async with httpx.AsyncClient(timeout=60) as client:
        started = time.perf_counter()
        for _ in range(count):
            response = await client.post(f"{base}/v1/chat/completions", json=body)
            response.raise_for_status()
        return (time.perf_counter() - started) / count


async def _local(prompt: str, max_tokens: int, count: int) -> float:
    engine = get_local_engine()
    await engine.start()
    started = time.perf_counter()
    for _ in range(count):
        await engine.generate(
            GenerationRequest(messages=[ChatMessage("user", prompt)], max_tokens=max_tokens)
        )
    return (time.perf_counter() - started) / count


async def measure(base: str, prompt: str, max_tokens: int, count: int = 10) -> Capacity:
    """Time ``count`` requests of the benchmark's size on the worker at ``base`` and on the
    local model, one after the other, then both loops at once."""
    primary = await _primary(base, prompt, max_tokens, count)
    local = await _local(prompt, max_tokens, count)
    shared = await asyncio.gather(
        _primary(base, prompt, max_tokens, count), _local(prompt, max_tokens, count)
    )
    return Capacity(primary, local, shared[0], shared[1])


def headroom(capacity: Capacity, *, concurrency: int, steps: int, budget_s: float) -> str:
    """Whether the healthy system can answer what the run offers, in words.

    The worst case a step can meet without any fault is every other run's request queued ahead
    of it on the same engine (the slower one, with both busy): ``concurrency`` answers in a row.
    A step is allotted about ``budget_s / steps``. When that worst case fits, a failed run is
    dispatch's doing; when it does not, the load alone can make a run fail.
    """
    slower = max(capacity.primary_shared_s, capacity.local_shared_s)
    worst = concurrency * slower
    share = budget_s / steps
    verdict = (
        f"headroom {share / worst:.1f}x: the healthy system can answer every step in time"
        if worst <= share
        else f"OVERLOADED ({share / worst:.2f}x): queues alone can exceed a step's share"
    )
    return (
        f"offered: {concurrency} runs at a time x {steps} steps in {budget_s:g}s; worst queue "
        f"{concurrency} x {slower * 1000:.0f} ms = {worst * 1000:.0f} ms vs "
        f"{share * 1000:.0f} ms a step -> {verdict}"
    )
