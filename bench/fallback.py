"""Chain success rate under injected faults, with fallbacks on and off; answers are checked.

    .venv/bin/python bench/fallback.py [--runs 2000] [--concurrency 4]
        [--modes off,retry,on,on-faulty] [--error-rate 0.05] [--spike-ms 800] [--spike-every 3]
        [--spike-for 1] [--budget 3s] [--steps 3] [--scenario faults|hung] [--load-cores N]
        [--breakdown] [--show-failures N]

``--scenario hung``: no injected errors or spikes; instead one of the two primary workers
accepts every request and never answers (fault ``hang``) for the whole run — the case where the
reserve must keep the fallback's time. Its workload is issue 14's own: a chain of two LLM steps
with a 6 s budget, two runs at a time (defaults of ``--steps``, ``--budget`` and
``--concurrency`` for this scenario). ``--load-cores N`` runs ``scripts/cpu_hog --cores N``
beside the benchmark (on a 2-core machine, ``--load-cores 2`` leaves the workers, the runner and
the in-process fallback fighting a neighbour for every core).

Before the modes, the bench measures what the engines can answer (``bench/_capacity.py``: the
healthy primary worker alone, the local model alone, both at once) and prints whether the offered
load fits: with ``--concurrency`` runs at a time, a step may find every other run's request
queued ahead of it on one single-generation engine. A workload where that worst case exceeds a
step's share of the budget is printed as OVERLOADED: its failures are the load's, not only
dispatch's (``--scenario hung --steps 3 --budget 3s --concurrency 4``, the workload of rounds
1-3, is one on a 2-core machine).

Two real workers (local llama.cpp engine, SmolLM2) serve the pool model ``primary``; each fails
``--error-rate`` of its requests with a 500 (fault injection), and every ``--spike-every``
seconds one of them, in turn, delays every request by ``--spike-ms`` for ``--spike-for`` seconds.
A chain of ``--steps`` LLM steps (three by default; each asks for the capital of France, up to
8 tokens; budget ``--budget``) runs ``--runs`` times per mode, ``--concurrency`` runs at a time, through one
runner and one dispatcher per mode:

* ``off``       — primary only, one try per step (a router with no retries and no fallbacks);
* ``retry``     — two tries per step (the retry goes to the other worker), no fallback;
* ``on``        — two tries, then the in-process ``local`` model as fallback. That fallback is
  a fault-free copy of the same model in this process: an upper bound, not a fleet;
* ``on-faulty`` — two tries, then the model ``backup``, served by a third worker under the same
  faults (the same error rate, and spikes on its own schedule of the same shape).

A run counts as *answered* only when it completed and every step's answer names Paris (the
model's answer at temperature 0, checked, not assumed); *completed* runs whose answers fail the
check are counted apart. Prints per mode: answered and completed rates, p50/p99 run latency, how
steps were answered, how the failing steps' tries ended, and how many failed steps were
*avoidable*: their allotment could hold a healthy primary answer and the fallback's (or the
retry's) behind it, at the capacity measured before the modes — a failure of such a step is
dispatch's, not the load's. ``--breakdown`` prints each failed step's attempts
(``bench/_fallback_trace.py``): when each started in the step and how long it ran, its endpoint,
how long that endpoint had been in a spike when the attempt started (negative: the spike began
during the attempt), and the attempts of the same model already in flight (for the in-process
fallback, its queue at the moment of fallback). Goal: >= 99.9 % answered with fallbacks on.

The default concurrency is 4 (2 for ``--scenario hung``) because each worker runs one llama.cpp
generation at a time and all engines (the workers and the in-process fallback) share the
machine's CPU: more runs at once only queue, and an overloaded CPU is a third fault the fallback
cannot absorb since it runs on the same cores (``--concurrency 8`` shows that case; the capacity
line printed first says whether a workload fits).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _capacity import Capacity, headroom, measure  # noqa: E402
from _fallback_trace import AttemptTrace, SpikeLog, avoidable, breakdown  # noqa: E402
from _workers import BenchWorker, local_workers  # noqa: E402

from chainrt._durations import parse_duration_ms  # noqa: E402
from chainrt._runtime import open_runtime  # noqa: E402
from chainrt.dispatch import make_dispatcher, parse_pool_config  # noqa: E402
from chainrt.engines import get_local_engine  # noqa: E402
from chainrt.spec import spec_from_dict  # noqa: E402

MODES: dict[str, dict[str, Any]] = {
    "off": {"fallbacks": [], "retry": {"attempts": 1}},
    "retry": {"fallbacks": [], "retry": {"attempts": 2, "backoff": "20ms"}},
    "on": {"fallbacks": ["local"], "retry": {"attempts": 2, "backoff": "20ms"}},
    "on-faulty": {"fallbacks": ["backup"], "retry": {"attempts": 2, "backoff": "20ms"}},
}
STEP_NAMES = ("a", "b", "c", "d", "e", "f")
QUESTION = "What is the capital of France?"
ANSWER = "paris"
"""Every step's answer must contain this (SmolLM2 at temperature 0: "The capital of France is
Paris.", 7 tokens)."""


def _chain(mode: str, budget: str, names: tuple[str, ...]) -> dict[str, Any]:
    steps = [
        {
            "id": step,
            "llm": {
                "model": "primary",
                "prompt": f"Step {step}: {{{{ input.q }}}}",
                "max_tokens": 8,
            },
            **MODES[mode],
        }
        for step in names
    ]
    return {
        "name": f"fallback-{mode}",
        "budget": budget,
        "inputs": {"q": "str"},
        "steps": steps,
        "output": {step: f"{{{{ steps.{step}.output }}}}" for step in names},
    }


def _answered(output: Any, names: tuple[str, ...]) -> bool:
    """Every step's answer is there and right."""
    return isinstance(output, dict) and all(
        ANSWER in str(output.get(step, "")).lower() for step in names
    )


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _spikes(
    workers: list[BenchWorker], every_s: float, for_s: float, spike_ms: float, log: SpikeLog
) -> None:
    async with httpx.AsyncClient() as client:
        turn = 0
        while True:
            await asyncio.sleep(max(every_s - for_s, 0))
            worker = workers[turn % len(workers)]
            turn += 1
            await worker.afaults(client, latency_ms=spike_ms)
            log.begin(worker.base)
            try:
                await asyncio.sleep(for_s)
            finally:
                await asyncio.shield(worker.afaults(client, latency_ms=0))
                log.end(worker.base)


async def _mode(
    mode: str,
    args: argparse.Namespace,
    workers: list[BenchWorker],
    backup: BenchWorker | None,
    store: str,
    capacity: Capacity,
) -> str:
    endpoints = ", ".join(f"{{url: '{w.base}'}}" for w in workers)
    text = f"models:\n  primary:\n    served_model: smol\n    endpoints: [{endpoints}]\n"
    if backup is not None:
        text += f"  backup:\n    served_model: smol\n    endpoints: [{{url: '{backup.base}'}}]\n"
    pool = parse_pool_config(text + "health: {interval: 500ms, timeout: 300ms}\n")
    dispatcher = make_dispatcher(pool)
    trace = AttemptTrace(dispatcher)
    spike_log = SpikeLog()
    names = STEP_NAMES[: args.steps]
    spec = spec_from_dict(_chain(mode, args.budget, names))
    latencies: list[float] = []
    statuses: collections.Counter[str] = collections.Counter()
    wrong = 0  # completed, but some answer does not name Paris
    answered: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    gate = asyncio.Semaphore(args.concurrency)
    shown: list[str] = []
    failed_steps = 0
    avoidable_steps = 0
    where: list[str] = []
    fallback_s = capacity.local_shared_s if mode == "on" else capacity.primary_shared_s
    try:
        async with open_runtime(store=store, pool=dispatcher) as runtime:

            async def one(i: int) -> None:
                nonlocal wrong, failed_steps, avoidable_steps
                async with gate:
                    started = time.perf_counter()
                    result = await runtime.runner.run(spec, {"q": QUESTION}, run_id=f"{mode}-{i}")
                    latencies.append((time.perf_counter() - started) * 1000)
                statuses[result.status] += 1
                for step in result.steps:
                    if step.status == "completed":
                        how = "primary, retried" if step.attempts > 1 else "primary"
                        answered[step.fallback or how] += 1
                if result.status == "completed":
                    if _answered(result.output, names):
                        return
                    wrong += 1
                    if len(shown) < args.show_failures:
                        shown.append(f"  {result.run_id}: wrong answer {result.output!r:.200}")
                    return
                steps_rec = await runtime.store.get_steps(result.run_id)
                stopped = steps_rec.get(result.stopped_at or "")
                if stopped is not None:
                    # e.g. "primary:5xx > local:timeout": how the failing step's tries ended
                    reasons[" > ".join(f"{a.model}:{a.status}" for a in stopped.attempt_log)] += 1
                    failed_steps += 1
                    if avoidable(stopped.allotted_ms, capacity.primary_shared_s, fallback_s):
                        avoidable_steps += 1
                    if args.breakdown:
                        entries = trace.by_step.get((result.run_id, stopped.step_id), [])
                        start = stopped.started_at or (entries[0].start if entries else 0.0)
                        where.append(
                            f"  {result.run_id}/{stopped.step_id} [{stopped.allotted_ms:.0f}ms]: "
                            + breakdown(entries, start, spike_log)
                        )
                if len(shown) < args.show_failures:
                    shown.append(
                        f"  {result.run_id} ({latencies[-1]:.0f} ms): "
                        + " | ".join(
                            f"{sid} [{rec.allotted_ms:.0f}ms] "
                            + ", ".join(
                                f"{a.model}@{(a.endpoint or '-').rsplit(':', 1)[-1]} "
                                f"{a.status} {a.elapsed_ms:.0f}ms"
                                + (f" ({a.detail})" if args.show_failures and a.detail else "")
                                for a in rec.attempt_log
                            )
                            for sid, rec in steps_rec.items()
                        )
                    )

            groups = [workers] if backup is None else [workers, [backup]]
            spikes = [
                asyncio.create_task(
                    _spikes(group, args.spike_every, args.spike_for, args.spike_ms, spike_log)
                )
                for group in groups
                if args.spike_ms > 0
            ]
            began = time.perf_counter()
            try:
                await asyncio.gather(*(one(i) for i in range(args.runs)))
            finally:
                for task in spikes:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            wall = time.perf_counter() - began
    finally:
        await dispatcher.close()
    completed = statuses["completed"]
    ok = completed - wrong
    steps = ", ".join(f"{k} {v}" for k, v in answered.most_common())
    line = (
        f"{mode:<9} answered {ok / args.runs * 100:7.3f} % ({ok}/{args.runs}; "
        f"completed {completed}, {wrong} of them with a wrong answer)   "
        f"p50 {_pct(latencies, 0.5):6.1f} ms   p99 {_pct(latencies, 0.99):7.1f} ms   "
        f"[{wall:.0f}s, {sum(answered.values()) / wall:.2f} answers/s]\n          steps answered by: {steps}"
    )
    if reasons:
        line += "\n       failed steps ended: " + "; ".join(
            f"{n}x {r}" for r, n in reasons.most_common(4)
        )
    if failed_steps:
        line += (
            f"\n       avoidable: {avoidable_steps} of {failed_steps} failed steps "
            f"({avoidable_steps / failed_steps * 100:.0f} %) had an allotment that could hold a "
            f"healthy primary answer ({capacity.primary_shared_s * 1000:.0f} ms) and the "
            f"fallback's ({fallback_s * 1000:.0f} ms) behind it"
        )
    return "\n".join([line, *shown, *where])


async def _main(args: argparse.Namespace, workers: list[BenchWorker]) -> list[str]:
    await get_local_engine().start()  # load the fallback model before the clock starts
    # Capacity first, before any fault is armed: what the healthy engines answer.
    capacity = await measure(workers[0].base, f"Step a: {QUESTION}", 8)
    print(capacity.describe(), flush=True)
    print(
        headroom(
            capacity,
            concurrency=args.concurrency,
            steps=args.steps,
            budget_s=parse_duration_ms(args.budget) / 1000,
        ),
        flush=True,
    )
    for worker in workers:
        worker.faults(error_rate=args.error_rate)
    if args.scenario == "hung":
        workers[1].faults(hang=True)
        print(f"hung endpoint: {workers[1].base}", flush=True)  # to read the attempt trails
    primaries, backup = workers[:2], (workers[2] if len(workers) > 2 else None)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            line = await _mode(
                mode,
                args,
                primaries,
                backup if mode == "on-faulty" else None,
                f"sqlite:///{tmp}/{mode}.db",
                capacity,
            )
            print(line, flush=True)
            lines.append(line)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=None, help="runs at a time (4; hung: 2)")
    parser.add_argument("--modes", default="off,retry,on,on-faulty")
    parser.add_argument("--error-rate", type=float, default=0.05)
    parser.add_argument("--spike-ms", type=float, default=800.0)
    parser.add_argument("--spike-every", type=float, default=3.0)
    parser.add_argument("--spike-for", type=float, default=1.0)
    parser.add_argument("--budget", default=None, help="each run's budget (3s; hung: 6s)")
    parser.add_argument(
        "--steps", type=int, default=None, help="LLM steps per chain, 1-6 (3; hung: 2)"
    )
    parser.add_argument(
        "--show-failures", type=int, default=0, help="print N failed runs' attempts"
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="print each failed step's attempts: start offset + length, spike age, queue joined",
    )
    parser.add_argument(
        "--scenario",
        choices=("faults", "hung"),
        default="faults",
        help="hung: one primary worker never answers (no injected errors, no spikes)",
    )
    parser.add_argument(
        "--load-cores", type=int, default=0, help="run scripts/cpu_hog on this many cores"
    )
    args = parser.parse_args()
    hung = args.scenario == "hung"
    if hung:
        args.error_rate, args.spike_ms = 0.0, 0.0
    if args.concurrency is None:
        args.concurrency = 2 if hung else 4
    if args.budget is None:
        args.budget = "6s" if hung else "3s"
    if args.steps is None:
        args.steps = 2 if hung else 3
    if not 1 <= args.steps <= len(STEP_NAMES):
        parser.error(f"--steps must be between 1 and {len(STEP_NAMES)}")
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        parser.error(
            f"unknown mode(s) {', '.join(sorted(unknown))}; choose from {', '.join(MODES)}"
        )
    parse_duration_ms(args.budget)
    count = 3 if "on-faulty" in args.modes.split(",") else 2
    print(
        f"{args.runs} runs x {args.steps} LLM steps per mode, {args.concurrency} at a time, budget {args.budget}; "
        f"2 primary workers{' + 1 backup worker' if count == 3 else ''}, "
        + (
            "one of the two primaries hangs (accepts, never answers)"
            if args.scenario == "hung"
            else f"{args.error_rate * 100:g} % injected 500s on each, +{args.spike_ms:g} ms spikes "
            f"{args.spike_for:g}s of every {args.spike_every:g}s (alternating primaries; the "
            "backup on its own schedule)"
        )
        + (f"; cpu_hog on {args.load_cores} core(s)" if args.load_cores else "")
        + "; a run is answered when every step names Paris",
        flush=True,
    )
    hog = None
    if args.load_cores > 0:
        hog = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "scripts" / "cpu_hog"),
                "6h",
                "--cores",
                str(args.load_cores),
            ]
        )
    try:
        with local_workers(
            count, "--enable-fault-injection", "--health-interval", "600"
        ) as workers:
            asyncio.run(_main(args, workers))
    finally:
        if hog is not None:
            hog.terminate()
            hog.wait()


if __name__ == "__main__":
    main()
