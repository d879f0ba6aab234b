"""Group commit with and without split batches, in one process, at many runs at once.

    .venv/bin/python bench/group_split.py [--runs 64] [--steps 100] [--rounds 8]

While a Redis round trip of commits is on the wire, commits of the runs it does not carry queue
behind it. Before issue 18's round 10 they all waited for it, and went in one batch when it came
back: the runs a batch's replies woke computed their next steps while nothing was on the wire, then
all waited on the one round trip that carried them. Now a batch that reaches ``COMMIT_SPLIT``
commits goes out at once in a round trip of its own (at most ``COMMIT_EXTRA`` at a time), so the
store works on one part of the runs' commits while the process computes the next
(``chainrt/store/_group.py``).

One runtime on a private AOF redis-server; each round runs ``--runs`` runs of ``--steps`` no-op
tool steps at once with the split off (as before) and then on, the group's two settings switched
between batches. It prints, as medians over the rounds: durable steps/s (each batch's wall time,
its runs' creation included), the process's CPU per step (``time.process_time``), and how busy the
process was (CPU time / wall time: what is left of 1.0 is time spent waiting on Redis)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from _redis import add_persistence_flag, persistence_label, private_server
from _step_samples import SOURCE, chain

from chainrt._gc import tune_gc_for_runner
from chainrt._runtime import open_runtime
from chainrt.spec import spec_from_dict
from chainrt.store import RedisStore
from chainrt.store._group import COMMIT_EXTRA, COMMIT_SPLIT

_MODES: dict[str, tuple[int | None, int]] = {
    "one batch at a time (before)": (None, 0),
    f"split at {COMMIT_SPLIT}, {COMMIT_EXTRA} extra (now)": (COMMIT_SPLIT, COMMIT_EXTRA),
}


async def _batch(runtime: Any, spec: Any, runs: int, steps: int) -> tuple[float, float]:
    """(steps/s, CPU us per step) of ``runs`` runs at once."""
    wall, cpu = time.perf_counter(), time.process_time()
    results = await asyncio.gather(
        *(runtime.runner.run(spec, {}, source_dir=SOURCE) for _ in range(runs))
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert all(r.status == "completed" for r in results), [r.error for r in results]
    return runs * steps / wall, cpu / (runs * steps) * 1e6


async def _main(url: str, runs: int, steps: int, rounds: int) -> None:
    spec = spec_from_dict(chain(steps))
    rows: dict[str, list[tuple[float, float]]] = {mode: [] for mode in _MODES}
    async with open_runtime(store=url) as runtime:
        store = runtime.store
        assert isinstance(store, RedisStore)
        group = store._commits
        await _batch(runtime, spec, runs, steps)  # imports, caches, scripts, connections
        tune_gc_for_runner()
        for _ in range(rounds):
            for mode, (split, extra) in _MODES.items():
                group._split, group._extra = split, extra
                rows[mode].append(await _batch(runtime, spec, runs, steps))
    print(
        f"store            {url}, {runs} runs at once x {steps} no-op tool steps, {rounds} rounds"
    )
    print(f"{'group commit':34}{'steps/s':>10}{'CPU us/step':>13}{'busy':>7}")
    for mode, got in rows.items():
        rate = statistics.median(r[0] for r in got)
        cpu = statistics.median(r[1] for r in got)
        busy = statistics.median(r[0] * r[1] / 1e6 for r in got)
        print(f"{mode:34}{rate:>10,.0f}{cpu:>13.1f}{busy:>7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=64, help="runs at once")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=8)
    add_persistence_flag(parser)
    args = parser.parse_args()
    print(f"private redis-server, {persistence_label(args)}")
    with private_server(args) as server:
        asyncio.run(_main(server.url, args.runs, args.steps, args.rounds))


if __name__ == "__main__":
    main()
