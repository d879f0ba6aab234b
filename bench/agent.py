"""Agent steps: the runtime's cost per loop iteration, and answers before the deadline.

    .venv/bin/python bench/agent.py [--model scripted|local|worker]
        [--store sqlite:///tmp/x.db | redis | redis://...] [--runs 20] [--iterations 5]
        [--model-ms 80] [--tool-ms 60] [--deadline-runs 20] [--chaos N]

``--model`` (bench/_agent_models.py): ``scripted`` (default), chainrt.testing.scripted_model, a
real HTTP server playing back a fixed conversation through the real dispatcher (``--model-ms`` a
turn); ``local``, SmolLM2-135M on llama.cpp in this process; ``worker``, a real
``chainrt-worker serve --engine local`` process (the same model) reached through HTTP. A real
model is told to call the tool in every reply and its turns are decoded into calls of a real
tool (``constrain: calls``); what it did is counted from the records. The tools are
bench/_agent_tools.py.

1. Overhead: an agent of up to ``--iterations`` tool turns (one no-op call each; the scripted
   model answers at once) then its answer. Per iteration, the runtime's own cost is the agent
   step's time less the time covered by its model turns (dispatch included), its calls (check
   and tool) and its checkpoint writes (the last calls' writes run beside the last turn: time
   covered by both counts once); beside it, a model turn's time (with a real model split into the
   engine's prefill + decode and the rest: dispatch, request and answer), a call's time, and
   the writes, per write, with how many an iteration makes (goal: <= 1 ms of overhead per
   iteration plus one durable commit per turn and per call).
2. Deadlines: each call takes ``--tool-ms``; three tool turns then the answer (the scripted model
   takes ``--model-ms`` a turn; a real model its own time, ``max_iterations: 3``). The full
   loop's time is measured with an ample budget, then ``--deadline-runs`` runs are made at 1.5x,
   1x and 0.5x of it (final_reserve: auto, from the dispatcher's answer times): how many
   answered, why their loops stopped, and by how much a run overshot its budget (goal: an answer
   in every run whose budget holds the final reserve). An answer the deadline cut (the agent's
   last turn kept the text it had: step and run ``partial``, read from the step's record) counts
   as answered and is also counted apart (``cut``). A run without an answer is shown with its
   turns. ``--deadline-runs 0`` skips this part.
3. ``--chaos N``: N runs killed with ``kill -9`` at random moments and resumed, on the store
   (bench/_agent_chaos.py; ``--store redis`` starts a private redis-server): recorded tool calls
   run again (goal: 0) and wrong outputs (goal: 0). Always the scripted model.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _agent_chaos import chaos
from _agent_models import KINDS, Model, Worker, chain_text, model_for

import chainrt
from chainrt.store import StepRecord, open_store
from chainrt.testing.redis_server import RedisServer
from chainrt.testing.scripted_model import answer, calls

HERE = Path(__file__).resolve().parent

ENGINE_HOPS = ("queue", "admission", "prefill", "decode")
"""An answered attempt's hops (its record's ``hops_ms``) that are the model's own time."""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(round(q * len(ordered)) - 1, 0))]


def ms(values: list[float]) -> str:
    """``p50 1.234 ms, p99 5.678 ms`` (``-`` when nothing was measured)."""
    if not values:
        return "-"
    return f"p50 {pct(values, 0.5):.3f} ms, p99 {pct(values, 0.99):.3f} ms"


class TimedStore:
    """The store, with each checkpoint write of an agent's turn or call timed."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.writes: list[float] = []
        self.spans: list[tuple[float, float]] = []
        """When each timed write ran (unix seconds, start and end)."""
        inner = store.commit

        async def commit(run_id: str, token: int, progress: Any, step: Any = None) -> Any:
            t0, began = time.perf_counter(), time.time()
            try:
                return await inner(run_id, token, progress, step)
            finally:
                if step is not None and (".turn[" in step.step_id or ".call[" in step.step_id):
                    self.writes.append((time.perf_counter() - t0) * 1000)
                    self.spans.append((began, time.time()))

        store.commit = commit


def covered_ms(spans: list[tuple[float, float]]) -> float:
    """The time (ms) covered by at least one of ``spans`` (unix seconds, start and end)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total * 1000


def chain_file(folder: Path, model: Model, budget: str, iterations: int, tool: str) -> Path:
    path = folder / f"agent_{model.name}_{tool}_{iterations}_{budget}.yaml"
    path.write_text(chain_text(model, budget=budget, iterations=iterations, tool=tool))
    return path


def engine_ms(turn: StepRecord) -> float | None:
    """The model's own time in a turn (its answered attempt's queue, prefill and decode, as
    the engine reported them), or None when not reported (the scripted model)."""
    for attempt in turn.attempt_log:
        if attempt.status == "ok" and attempt.hops_ms:
            return float(sum(v for k, v in attempt.hops_ms.items() if k in ENGINE_HOPS))
    return None


async def overhead(
    args: argparse.Namespace, folder: Path, store_url: str, worker: Worker | None
) -> None:
    script = [calls(("noop", {}))] * args.iterations + [answer("done")]
    with model_for(args.model, folder, script, 0.0, worker) as model:
        budget = "60s" if not model.real else "300s"
        chain = chainrt.load(chain_file(folder, model, budget, args.iterations, "noop"))
        timed = TimedStore(open_store(store_url))
        per_iteration: list[float] = []
        writes_per_iteration: list[float] = []
        turn_ms: list[float] = []
        engine: list[float] = []
        beside: list[float] = []
        call_ms: list[float] = []
        writes: list[float] = []
        shape: collections.Counter[str] = collections.Counter()
        for run in range(args.runs + 2):  # two warm-up runs
            timed.writes.clear()
            timed.spans.clear()
            result = await chain.arun({"q": "Go."}, run_id=f"o{run}-{time.time_ns()}",
                                      store=timed.store, pool=model.pool)  # fmt: skip
            assert result.status == "completed", result.error
            steps = await timed.store.get_steps(result.run_id)
            turns = [r for p, r in steps.items() if ".turn[" in p]
            made = [r for p, r in steps.items() if ".call[" in p]
            spans = [(r.started_at or 0.0, (r.started_at or 0.0) + r.elapsed_ms / 1000)
                     for r in (*turns, *made)]  # fmt: skip
            own = steps["agent"].elapsed_ms - covered_ms(spans + timed.spans)
            if run < 2:
                continue
            per_iteration.append(own / len(turns))
            writes_per_iteration.append(len(timed.writes) / len(turns))
            writes.extend(timed.writes)
            shape["turns"] += len(turns)
            shape["calls"] += len(made)
            shape["bad calls"] += sum(1 for r in made if r.status != "completed")
            shape[f"stopped {result.output['stopped']}"] += 1
            for turn in turns:
                turn_ms.append(turn.elapsed_ms)
                own_time = engine_ms(turn)
                if own_time is not None:
                    engine.append(own_time)
                    beside.append(turn.elapsed_ms - own_time)
            call_ms.extend(r.elapsed_ms for r in made)
        await timed.store.close()
    kind = store_url.split(":")[0]
    print(f"overhead (model {args.model}, {kind}; {args.runs} runs of up to {args.iterations} "
          f"tool turns + the answer: {shape['turns'] / args.runs:.1f} turns and "
          f"{shape['calls'] / args.runs:.1f} calls a run, {dict(shape)}):")  # fmt: skip
    print(f"  runtime per iteration: {ms(per_iteration)} (goal <= 1 ms)")
    print(f"  a model turn: {ms(turn_ms)}")
    if engine:
        print(f"    the engine's own (queue + prefill + decode): {ms(engine)}")
        print(f"    the rest (dispatch, request and answer, parsing): {ms(beside)}")
    print(f"  a tool call (check + no-op tool): {ms(call_ms)}")
    print(f"  durable writes per iteration: {statistics.mean(writes_per_iteration):.2f} "
          f"(one per turn and one per call), each {ms(writes)}")  # fmt: skip


async def deadlines(
    args: argparse.Namespace, folder: Path, store_url: str, worker: Worker | None
) -> None:
    os.environ["BENCH_AGENT_TOOL_MS"] = str(args.tool_ms)
    script = [calls(("pause", {}))] * 3 + [answer("done")]
    with model_for(args.model, folder, script, args.model_ms / 1000, worker) as model:
        iterations = 3 if model.real else 6
        ample = "60s" if not model.real else "300s"
        full = chainrt.load(chain_file(folder, model, ample, iterations, "pause"))
        fulls = []
        for run in range(5):  # also fills the dispatcher's answer times (the auto reserve)
            result = await full.arun({"q": "Go."}, run_id=f"f{run}-{time.time_ns()}",
                                     store=store_url, pool=model.pool)  # fmt: skip
            assert result.status == "completed", result.error
            fulls.append(result.budget.used_ms)
        need = statistics.median(fulls)
        model_time = f"{args.model_ms:g} ms a turn" if not model.real else "its own time"
        print(f"deadlines (model {args.model}: {model_time}, tool {args.tool_ms:g} ms a call, "
              f"{store_url.split(':')[0]}; the full loop takes {need:.0f} ms, stopped "
              f"{result.output['stopped']}):")  # fmt: skip
        for factor in (1.5, 1.0, 0.5):
            budget = need * factor
            chain = chainrt.load(chain_file(folder, model, f"{budget:.0f}ms", iterations, "pause"))
            statuses: collections.Counter[str] = collections.Counter()
            stopped: collections.Counter[str] = collections.Counter()
            over: list[float] = []
            answered = cut = 0
            shown = 0
            for run in range(args.deadline_runs):
                result = await chain.arun({"q": "Go."}, run_id=f"d{factor}-{run}-{time.time_ns()}",
                                          store=store_url, pool=model.pool)  # fmt: skip
                statuses[result.status] += 1
                output = result.output if isinstance(result.output, dict) else {}
                if result.status == "partial":  # an answer cut at the deadline: in its record
                    output = await agent_output(result.run_id, store_url)
                if output.get("answer"):
                    answered += 1
                    cut += bool(output.get("cut"))
                    stopped[str(output.get("stopped"))] += 1
                elif shown < 3:
                    shown += 1
                    await show(result, store_url)
                over.append(result.budget.used_ms - budget)
            print(f"  {factor:>3}x ({budget:.0f} ms): answered {answered}/{args.deadline_runs} "
                  f"({cut} cut at the deadline), "
                  f"statuses {dict(statuses)}, stopped {dict(stopped)}, "
                  f"overshoot max {max(over):+.1f} ms")  # fmt: skip


async def agent_output(run_id: str, store_url: str) -> dict[str, Any]:
    """The output of the run's agent step, as recorded."""
    store = open_store(store_url)
    try:
        steps = await store.get_steps(run_id)
    finally:
        await store.close()
    record = steps.get("agent")
    return record.output if record is not None and isinstance(record.output, dict) else {}


async def show(result: Any, store_url: str) -> None:
    """A run without an answer: its status and error, and each turn and call of its agent."""
    print(f"    no answer: run {result.run_id} {result.status}: {result.error}")
    store = open_store(store_url)
    try:
        steps = await store.get_steps(result.run_id)
    finally:
        await store.close()
    begun = min((r.started_at or 0.0) for r in steps.values())
    for path, record in sorted(steps.items(), key=lambda item: item[1].started_at or 0.0):
        tries = "; ".join(f"{a.status} {a.elapsed_ms:.0f} ms" for a in record.attempt_log)
        at = ((record.started_at or begun) - begun) * 1000
        end = ((record.finished_at or begun) - begun) * 1000
        print(f"      {path}: {record.status}, +{at:.1f} -> +{end:.1f} ms, took "
              f"{record.elapsed_ms:.1f} of {record.allotted_ms or 0:.1f} ms"
              f"{f'; tries: {tries}' if tries else ''}")  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=KINDS, default="scripted")
    parser.add_argument("--store", default=None)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--model-ms", type=float, default=80.0)
    parser.add_argument("--tool-ms", type=float, default=60.0)
    parser.add_argument("--deadline-runs", type=int, default=20)
    parser.add_argument("--chaos", type=int, default=0, metavar="N")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        (folder / "_agent_tools.py").write_text((HERE / "_agent_tools.py").read_text())
        store = args.store or f"sqlite:///{folder / 'runs.db'}"
        if store == "redis":
            store = stack.enter_context(RedisServer()).url
        if args.chaos:
            counts = await chaos(args.chaos, store, folder)
            print(f"chaos ({store.split(':')[0]}): {json.dumps(counts)}")
            return
        worker = stack.enter_context(Worker()) if args.model == "worker" else None
        await overhead(args, folder, store, worker)
        if args.deadline_runs:
            await deadlines(args, folder, store, worker)


if __name__ == "__main__":
    asyncio.run(main())
