"""One side of ``bench/step_ab.py``: a runner process that runs one batch per line it reads.

    python bench/_ab_worker.py REDIS_URL LEVEL STEPS

It imports chainrt from wherever ``PYTHONPATH`` puts it first (``step_ab.py`` points it at one
checkout or the other), warms up, tunes the collector as ``chainrt run``/``serve`` do, prints
``ready``, and then for each non-empty line on stdin runs LEVEL runs at once of a chain of STEPS
no-op tool steps on the private Redis at REDIS_URL and prints one line: the process's CPU us per
step, durable steps/s, and the bytes per step its runs held in memory just before their last step
was written (tracemalloc, only when the line says ``memory``). An empty line ends it.
"""

from __future__ import annotations

import asyncio
import sys
import time
import tracemalloc
from typing import Any

from _step_samples import SOURCE, chain

import chainrt
from chainrt._gc import tune_gc_for_runner
from chainrt._progress import Progress
from chainrt._runtime import open_runtime
from chainrt.spec import spec_from_dict


class _Held(Progress):
    """Notes the traced memory when the first step starts and when the last one is written."""

    def __init__(self, last: str) -> None:
        self.last = last
        self.start = 0
        self.end = 0

    def step_started(self, step: Any, allotted_ms: float, model: str | None) -> None:
        if not self.start:
            self.start = tracemalloc.get_traced_memory()[0]

    def step_finished(self, record: Any) -> None:
        if record.step_id == self.last:
            self.end = tracemalloc.get_traced_memory()[0]


async def _serve(url: str, level: int, steps: int) -> None:
    spec = spec_from_dict(chain(steps))
    async with open_runtime(store=url) as runtime:
        runner = runtime.runner
        await runner.run(spec, {}, source_dir=SOURCE)  # imports, caches, scripts
        tune_gc_for_runner()
        print(f"ready {chainrt.__file__}", flush=True)
        loop = asyncio.get_running_loop()
        while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
            if line == "memory":  # one run, traced: what a run holds per step before its end
                held = _Held(spec.steps[-1].id)
                tracemalloc.start()
                await runner.run(spec, {}, source_dir=SOURCE, progress=held)
                tracemalloc.stop()
                print(f"0 0 {(held.end - held.start) / steps:.0f}", flush=True)
                continue
            cpu, wall = time.process_time(), time.perf_counter()
            results = await asyncio.gather(
                *(runner.run(spec, {}, source_dir=SOURCE) for _ in range(level))
            )
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            assert all(r.status == "completed" for r in results)
            count = level * steps
            print(f"{cpu / count * 1e6:.2f} {count / wall:.0f} 0", flush=True)


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
