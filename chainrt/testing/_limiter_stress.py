"""The limiter stress run: random acquire / release / cancel / wait, invariants checked throughout.

Used by ``LimiterConformance`` and by the stress tests; ``chainrt.testing.limiter_conformance``
re-exports ``run_stress`` and ``StressReport``.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from chainrt._errors import ConcurrencyRejected
from chainrt.concurrency import KeyRequest, Limiter

__all__ = ["StressReport", "run_stress"]


@dataclass
class StressReport:
    """What a :func:`run_stress` run did (to check it exercised every path)."""

    granted: int = 0
    rejected: int = 0
    cancelled: int = 0
    released: int = 0
    peak: Counter[str] = field(default_factory=Counter)
    """Most holders of each key at once, counted by the actors themselves."""


async def run_stress(
    limiter: Limiter,
    limits: dict[str, int],
    *,
    ops: int,
    seed: int,
    rates: dict[str, float] | None = None,
    via: Sequence[Limiter] = (),
) -> StressReport:
    """Random acquire / release / cancel / wait operations; invariants checked after each one.

    Invariants: the actors' own count of holders per key never exceeds its limit (a check that
    does not trust the limiter's bookkeeping); the limiter reports at most ``limit`` holders, all
    of them live actors; every ticket belongs to an actor still inside ``acquire``. At the end,
    with every actor released or cancelled, no key has a holder or a ticket.

    ``rates`` puts a rate on some keys. ``via``: limiters sharing ``limiter``'s state (several
    Redis limiter instances, standing in for processes); each actor picks one at random.
    """
    rng = random.Random(seed)
    report = StressReport()
    rates = rates or {}
    doors = list(via) or [limiter]
    believed: Counter[str] = Counter()
    acquiring: set[str] = set()
    holding: dict[str, asyncio.Event] = {}
    tasks: dict[str, asyncio.Task[None]] = {}

    async def actor(name: str, reqs: list[KeyRequest], timeout_s: float, door: Limiter) -> None:
        try:
            held = await door.acquire(reqs, timeout_s=timeout_s, holder=name)
        except ConcurrencyRejected:
            report.rejected += 1
            return
        finally:
            acquiring.discard(name)
        report.granted += 1
        holding[name] = release = asyncio.Event()
        for key in held.keys:
            believed[key] += 1
            report.peak[key] = max(report.peak[key], believed[key])
            assert believed[key] <= limits[key], f"{key}: {believed[key]} holders"
        try:
            await release.wait()
            report.released += 1
        finally:
            del holding[name]
            for key in held.keys:
                believed[key] -= 1
            await held.release()

    async def settle() -> None:
        # A cancellation that reaches an actor while its undo (or release) is under way ends the
        # actor at once and leaves the undo to finish in the limiter's own task, one round trip
        # later: the limiter's contract. Let such undos land before looking at the state.
        for door in doors:
            pending = [t for t in getattr(door, "_background", ()) if not t.done()]
            if pending:
                await asyncio.wait(pending)

    async def check() -> None:
        await settle()
        live = {name for name, task in tasks.items() if not task.done()}
        inside_acquire = set(acquiring)  # taken before the snapshots, which may await
        for key, limit in limits.items():
            assert believed[key] <= limit
            state = await limiter.snapshot(key)
            assert len(state.holders) <= limit, state
            assert set(state.holders) <= live, state
            assert set(state.waiting) <= inside_acquire, state

    keys = sorted(limits)
    for i in range(ops):
        roll = rng.random()
        live = [name for name, task in tasks.items() if not task.done()]
        if roll < 0.4 or not live:
            picked = rng.sample(keys, rng.randint(1, len(keys)))
            reqs = [KeyRequest(k, limits[k], rate_per_s=rates.get(k)) for k in picked]
            timeout_s = rng.choice([0.0, 0.001, 0.005, 0.02, 0.1])
            door = rng.choice(doors)
            acquiring.add(f"a{i}")  # from now on: it may start (and queue) during any await
            tasks[f"a{i}"] = asyncio.create_task(actor(f"a{i}", reqs, timeout_s, door))
        elif roll < 0.6 and holding:
            holding[rng.choice(sorted(holding))].set()
        elif roll < 0.75:
            victim = tasks[rng.choice(live)]
            victim.cancel()
            await asyncio.gather(victim, return_exceptions=True)
            report.cancelled += 1
        else:
            await asyncio.sleep(rng.choice([0.0, 0.0, 0.0005, 0.002]))
        await check()
    for task in tasks.values():
        task.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    await check()
    return report
