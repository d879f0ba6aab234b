"""One run at a time: the per-step samples of ``bench/overhead.py`` and the lines it prints.

:func:`one_run` runs one chain of no-op steps and adds its figures to a :class:`Samples`: the
gaps between consecutive steps' starts (a durable step: budget decision, rendering, the tool
call, the atomic checkpoint), the whole run's wall time, the run's start (call to first step) and
end (last step's start to the return). :func:`report` prints them; ``bench/overhead.py`` and the
interleaved cluster comparison (``bench/_cluster.py``) share both.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SOURCE", "Samples", "chain", "levels", "one_run", "pct", "report"]

SOURCE = Path(__file__).resolve().parent
"""Where the chain's tool file (``_noop_tools.py``) lives."""


def chain(steps: int) -> dict[str, Any]:
    """A chain of ``steps`` no-op tool steps (each one checkpointed)."""
    return {
        "name": "overhead",
        "budget": "10m",
        "steps": [{"id": f"s{i}", "tool": "_noop_tools.py:noop"} for i in range(steps)],
    }


def levels(text: str) -> list[int]:
    """Runs at once from a ``--concurrency``/``--levels`` value such as ``1,8,64``."""
    return [int(part) for part in text.split(",") if part.strip()]


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank, no interpolation)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Samples:
    """The figures of the runs of one store, in ms (``total_s``: the runs' wall time, s)."""

    per_step: list[float] = field(default_factory=list)
    whole: list[float] = field(default_factory=list)
    run_start: list[float] = field(default_factory=list)
    run_end: list[float] = field(default_factory=list)
    total_steps: int = 0
    total_s: float = 0.0


async def one_run(runtime: Any, spec: Any, steps: int, into: Samples) -> tuple[float, float]:
    """Run ``spec`` once on ``runtime``, add its figures to ``into``; return this run's per-step
    p50 (ms) and its wall time (s)."""
    called = time.time()  # the records' clock (wall time)
    t = time.perf_counter()
    result = await runtime.runner.run(spec, {}, source_dir=SOURCE)
    took = time.perf_counter() - t
    returned = time.time()
    assert result.status == "completed", result.error
    records = await runtime.store.get_steps(result.run_id)
    starts = sorted(r.started_at for r in records.values())
    gaps = [(b - a) * 1e3 for a, b in itertools.pairwise(starts)]
    into.per_step += gaps
    into.whole.append(took * 1e3)
    into.run_start.append((starts[0] - called) * 1e3)
    into.run_end.append((returned - starts[-1]) * 1e3)
    into.total_steps += steps
    into.total_s += took
    return statistics.median(gaps), took


def report(
    url: str, tracing: bool, runs: int, steps: int, s: Samples, raw: tuple[float, str]
) -> None:
    """Print overhead.py's one-run-at-a-time block for one store."""
    raw_ms, raw_name = raw
    p50, p99 = pct(s.per_step, 0.5), pct(s.per_step, 0.99)
    w50, w99 = pct(s.whole, 0.5), pct(s.whole, 0.99)
    print(f"store            {url}")
    print(f"tracing          {'on' if tracing else 'off'}")
    print(f"runs x steps     {runs} x {steps}")
    print(f"per durable step p50 {p50:.3f} ms   p99 {p99:.3f} ms   (step start to next step start)")
    print(
        f"whole run        p50 {w50:.3f} ms   p99 {w99:.3f} ms   ({steps} steps; "
        f"{w50 / steps:.3f} ms per step at p50, run creation and final commit included)"
    )
    print(
        f"  run start      p50 {pct(s.run_start, 0.5):.3f} ms   p99 {pct(s.run_start, 0.99):.3f} ms"
        "   (call to first step: create record, lease, set-up)"
    )
    print(
        f"  run end        p50 {pct(s.run_end, 0.5):.3f} ms   p99 {pct(s.run_end, 0.99):.3f} ms"
        "   (last step start to return: last step, final commit, release)"
    )
    print(
        f"throughput       {s.total_steps / s.total_s:,.0f} durable steps/s (whole runs, one process)"
    )
    print(f"{raw_name:<16} p50 {raw_ms:.3f} ms   ratio step/raw {p50 / raw_ms:.1f}x")
