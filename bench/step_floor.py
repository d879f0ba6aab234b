"""The least a durable step can cost in one asyncio process, next to what chainrt's runner costs.

    .venv/bin/python bench/step_floor.py [--levels 1,64] [--steps 100] [--rounds 5] [--delay-us D]

Issue 18 asks for a durable step near the Redis round trip at one run (p50 <= 1.5x a raw
EVALSHA) and for 64 runs at once to do >= 4x the steps/s of one run. Both are bounded by how much
CPU a step costs in the runner's process, so this bench measures a *floor*: the same work with
nothing of the runtime around it. Each floor run awaits the same no-op tool, builds its step
record and the run's progress as plain dicts with the runner's fields, encodes each with
``json.dumps``, packs the store's own commit script call (the same script, keys and arguments as
``RedisStore.commit``) and sends it on one shared connection: a commit goes out at once when
nothing else is waiting in the same loop turn, and the commits of one turn go in one write (group
commit); one reader task settles the replies in order. No budget, templates, retries, deadlines,
fencing checks on the reply beyond "written", tracing hooks or error handling: a floor, not a
runtime.

Between the two, a ladder: ``store`` is the floor's loop with chainrt's own step record and
progress builders and ``RedisStore.commit`` (encoding, group commit, the bare connection);
``journal`` is the same through a run's ``RunJournal`` (budget clock, the commit's bound, the
in-memory run state); ``runner`` is ``Runner.run`` itself (the budget loop, the step, the tool
executor, the hooks). What a line adds over the one above it is what that layer costs.

For each level N it runs ``--rounds`` interleaved rounds of N runs at once of each line
(``open_runtime`` on the same private redis-server, the same chain of no-op tool steps), and
prints, as medians over the rounds: durable steps/s (over each batch's wall time, its runs'
creation included on every line), the step p50 (step start to the next step's start), and the
process's CPU per step (``time.process_time``: Python and the kernel's work for its sockets). Last,
the ratios the issue's goals are about, for each line: N vs the first level, and the step p50 at
the first level against a raw EVALSHA round trip (redis-py, measured in every round)."""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import itertools
import json
import statistics
import time
from typing import Any

from _noop_tools import noop
from _redis import (
    add_delay_flag,
    add_persistence_flag,
    delay_label,
    persistence_label,
    private_server,
    reached,
)
from _step_samples import SOURCE, chain, levels, pct

from chainrt._gc import tune_gc_for_runner
from chainrt._records import RunRecord, StepRecord
from chainrt._run._journal import Clock, RunJournal
from chainrt._runtime import open_runtime
from chainrt.redis import pack_args
from chainrt.redis.keys import StoreKeys
from chainrt.spec import spec_from_dict
from chainrt.store._built import attempt_record, run_progress, step_record
from chainrt.store._commit_wire import commit_wire
from chainrt.store._scripts import SCRIPTS

_LADDER = ("floor", "store", "journal", "runner")
"""What each line adds: the floor; chainrt's records and store commit; the run's journal; the
whole runner (budget loop, step, tool executor, progress and interceptor hooks)."""

_HEAD = b"*16\r\n" + pack_args(("EVALSHA", SCRIPTS["commit"].sha, "2"))


class _Pipe:
    """One connection: commits written at once or per loop turn, replies settled in order."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self.batch: list[bytes] = []
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.ensure_future(self._read())

    def commit(self, command: bytes) -> asyncio.Future[None]:
        future = self.loop.create_future()
        idle = not self.waiting
        self.waiting.append(future)
        if idle:  # nothing in flight: out at once (a lone run waits for no loop turn)
            self.writer.write(command)
            return future
        if not self.batch:
            self.loop.call_soon(self._flush)
        self.batch.append(command)
        return future

    def _flush(self) -> None:
        batch, self.batch = self.batch, []
        self.writer.write(b"".join(batch))

    async def _read(self) -> None:
        reader = self.reader
        while True:
            line = await reader.readuntil(b"\r\n")
            if line == b"*1\r\n":  # the commit script's {0}: written
                line = await reader.readuntil(b"\r\n")
            future = self.waiting.popleft()
            if line == b":0\r\n":
                future.set_result(None)
            else:  # (a refusal's array is not read to its end: the bench stops at the first)
                future.set_exception(RuntimeError(f"commit refused: {line!r}"))


async def _floor_run(
    pipe: _Pipe, keys: tuple[str, str], template: dict[str, Any], steps: int, starts: list[float]
) -> None:
    t0 = time.perf_counter()
    for i in range(steps):
        started = time.time()
        output = await noop()
        record = dict(template)
        record.update(
            step_id=f"s{i}",
            output=output,
            started_at=started,
            finished_at=time.time(),
            elapsed_ms=0.01,
        )
        progress = {
            "status": "running",
            "budget_used_ms": (time.perf_counter() - t0) * 1000,
            "output": None,
            "error": None,
            "stopped_at": None,
            "release_owner": False,
            "waits_ms": {},
            "budget_total_ms": None,
            "trace": None,
        }
        args: list[str | bytes] = [
            "1",
            "running",
            json.dumps(progress).encode(),
            repr(time.time()),
            "",
            b"",
            "0",
            "1",
            f"s{i}",
            json.dumps(record).encode(),
            "0",
        ]
        await pipe.commit(commit_wire(_HEAD, keys, args))
        starts.append(started)


async def _new_runs(store: Any, kind: str, level: int, n: itertools.count[int]) -> list[RunRecord]:
    """``level`` fresh runs in ``store`` (token 1) for one batch of the ``kind`` line."""
    records = []
    for _ in range(level):
        record = RunRecord(run_id=f"{kind}-{next(n)}", chain=kind, spec={}, input={},
                           budget_total_ms=600_000.0, fencing_token=1)  # fmt: skip
        await store.create_run(record)
        records.append(record)
    return records


async def _floor_batch(
    pipe: _Pipe,
    runtime: Any,
    template: dict[str, Any],
    level: int,
    steps: int,
    n: itertools.count[int],
) -> list[list[float]]:
    records = await _new_runs(runtime.store, "floor", level, n)
    starts: list[list[float]] = [[] for _ in records]
    keys = StoreKeys("chainrt")
    await asyncio.gather(
        *(
            _floor_run(pipe, (keys.run(r.run_id), keys.steps(r.run_id)), template, steps, s)
            for r, s in zip(records, starts, strict=True)
        )
    )
    return starts


def _record(i: int, output: Any, started: float) -> StepRecord:
    """The step record the runner writes for a no-op tool step (its own builders)."""
    return step_record(
        step_id=f"s{i}", status="completed", output=output, attempts=1, model=None,
        fallback=None, allotted_ms=1000.0, elapsed_ms=0.01, started_at=started,
        finished_at=time.time(), error=None, attempt_log=[attempt_record(1, "ok", 0.01)],
        waits_ms={}, confidence_score=None, verification_status=None, degraded=None,
        contradictions=None,
    )  # fmt: skip


async def _store_run(store: Any, run_id: str, steps: int, starts: list[float]) -> None:
    for i in range(steps):
        started = time.time()
        output = await noop()
        progress = run_progress(
            status="running", budget_used_ms=1.0, output=None, error=None, stopped_at=None,
            release_owner=False, waits_ms={}, budget_total_ms=None, trace=None,
        )  # fmt: skip
        await store.commit(run_id, 1, progress, _record(i, output, started))
        starts.append(started)


async def _journal_run(store: Any, record: RunRecord, steps: int, starts: list[float]) -> None:
    journal = RunJournal(store, record, {}, Clock(record.budget_total_ms))
    for i in range(steps):
        started = time.time()
        output = await noop()
        await journal.record_step(_record(i, output, started))
        starts.append(started)
    journal.close()


async def _ladder_batch(
    kind: str, runtime: Any, level: int, steps: int, n: itertools.count[int]
) -> list[list[float]]:
    """``store``: the floor's steps with chainrt's records and ``RedisStore.commit``;
    ``journal``: the same through the run's ``RunJournal`` (progress, the commit's bound)."""
    store = runtime.store
    records = await _new_runs(store, kind, level, n)
    starts: list[list[float]] = [[] for _ in records]
    if kind == "store":
        runs = [_store_run(store, r.run_id, steps, s) for r, s in zip(records, starts, strict=True)]
    else:
        runs = [_journal_run(store, r, steps, s) for r, s in zip(records, starts, strict=True)]
    await asyncio.gather(*runs)
    return starts


async def _runner_batch(runtime: Any, spec: Any, level: int) -> list[Any]:
    return await asyncio.gather(
        *(runtime.runner.run(spec, {}, source_dir=SOURCE) for _ in range(level))
    )


async def _runner_starts(runtime: Any, results: list[Any]) -> list[list[float]]:
    """The step start times of the runner's runs, read back after the clock stopped."""
    out = []
    for result in results:
        assert result.status == "completed", result.error
        records = await runtime.store.get_steps(result.run_id)
        out.append(sorted(r.started_at for r in records.values()))
    return out


async def _timed(batch: Any, read_back: Any = None) -> tuple[float, float, list[float]]:
    """(steps/s, CPU us per step, step-to-step gaps in ms) of one batch (its runs' creation
    included, on every line). ``read_back`` turns what the batch returned into its runs' step
    start times, after the clocks stopped (the runner's: read from the store)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = await batch
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    starts = result if read_back is None else await read_back(result)
    count = sum(len(s) for s in starts)
    gaps = [(b - a) * 1e3 for s in starts for a, b in itertools.pairwise(s)]
    return count / wall, cpu / count * 1e6, gaps


async def _raw_p50(client: Any, sha: str, n: int = 300) -> float:
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        await client.evalsha(sha, 0)
        samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples)


async def _main(url: str, levels: list[int], steps: int, rounds: int) -> None:
    import redis.asyncio as aioredis

    spec = spec_from_dict(chain(steps))
    host, port = url.removeprefix("redis://").split("/")[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    pipe = _Pipe(reader, writer)
    client = aioredis.Redis.from_url(url)
    sha = await client.script_load("return 1")
    n = itertools.count()
    async with open_runtime(store=url) as runtime:
        warm = await runtime.runner.run(spec, {}, source_dir=SOURCE)  # imports, caches, scripts
        template = (await runtime.store.get_steps(warm.run_id))["s0"].model_dump(mode="json")
        await _floor_batch(pipe, runtime, template, 1, steps, n)
        tune_gc_for_runner()
        rows: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {}
        for _ in range(rounds):
            for level in levels:
                raw = await _raw_p50(client, sha)
                runner_starts = functools.partial(_runner_starts, runtime)
                for name, batch, read_back in (
                    ("floor", _floor_batch(pipe, runtime, template, level, steps, n), None),
                    ("store", _ladder_batch("store", runtime, level, steps, n), None),
                    ("journal", _ladder_batch("journal", runtime, level, steps, n), None),
                    ("runner", _runner_batch(runtime, spec, level), runner_starts),
                ):
                    rate, cpu, gaps = await _timed(batch, read_back)
                    rows.setdefault((name, level), []).append((rate, cpu, pct(gaps, 0.5), raw))
    pipe.task.cancel()
    writer.close()
    await client.aclose()
    print(f"store            {url}, chain of {steps} no-op tool steps, {rounds} rounds (medians)")
    print(
        f"{'':8}{'runs at once':>13}{'steps/s':>10}{'CPU us/step':>13}{'step p50 ms':>13}"
        f"{'p50/raw':>9}{'vs N=' + str(levels[0]):>10}"
    )
    for name in _LADDER:
        base = statistics.median(r[0] for r in rows[(name, levels[0])])
        for level in levels:
            got = rows[(name, level)]
            rate = statistics.median(r[0] for r in got)
            ratio = statistics.median(r[2] / r[3] for r in got)
            print(
                f"{name:8}{level:>13}{rate:>10,.0f}{statistics.median(r[1] for r in got):>13.1f}"
                f"{statistics.median(r[2] for r in got):>13.3f}{ratio:>8.2f}x"
                f"{rate / base:>9.2f}x"
            )
    print(
        f"raw EVALSHA p50 (redis-py, per round): "
        f"{', '.join(f'{r[3]:.3f}' for r in rows[('floor', levels[0])])} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--levels", default="1,64", help="runs at once, e.g. 1,8,64")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    add_persistence_flag(parser)
    add_delay_flag(parser)
    args = parser.parse_args()
    print(f"private redis-server, {persistence_label(args)}; {delay_label(args)}")
    with private_server(args) as server, reached(server, args) as url:
        asyncio.run(_main(url, levels(args.levels), args.steps, args.rounds))


if __name__ == "__main__":
    main()
