"""The failover drill: many runs on a Redis Cluster, a master killed with ``kill -9`` mid-way.

Shared by ``tests/test_cluster_failover.py`` and ``bench/cluster_failover.py``::

    with LocalCluster(node_timeout_ms=1000) as cluster:
        report = failover_drill(cluster, chain=Path("tests/data/drill/ten.yaml"),
                                log_dir=tmp, runs=200, processes=4)
    assert report.ok, report.problems

``processes`` runner processes (real ``python`` children, each with its own runtime) share the
runs and run ``concurrency`` of them at a time. Once ``kill_at`` of the runs have completed, the
master that serves the most runs still in flight is killed; its replica is promoted
(``cluster-node-timeout`` later) while the runners keep going: their store calls retry within the
URL's ``retry_for_s``. Then every run is judged from its step log (the drill tools write one line
per call, before the call does anything) and its records: completed, the right output, every step
recorded, and no step run twice (no runner process dies here, so a second run of a step could only
be a lost or re-done checkpoint).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import RunNotFound
from ..store import open_store
from .drill import expected_output, read_log
from .redis_cluster import LocalCluster

__all__ = ["FailoverReport", "failover_drill"]

_RUNNER = """
import asyncio, json, sys
from chainrt._runtime import open_runtime

async def main() -> None:
    chain, store, log_dir, concurrency = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    ids = sys.argv[5:]
    gate = asyncio.Semaphore(concurrency)
    async with open_runtime(store=store) as rt:
        async def one(run_id: str) -> None:
            async with gate:
                try:
                    result = await rt.run(chain, {"seed": run_id, "log_dir": log_dir}, run_id=run_id)
                    line = {"run_id": run_id, "status": result.status, "error": result.error}
                except Exception as exc:
                    line = {"run_id": run_id, "status": "raised", "error": f"{type(exc).__name__}: {exc}"}
                print(json.dumps(line), flush=True)
        await asyncio.gather(*(one(r) for r in ids))

asyncio.run(main())
"""


@dataclass
class FailoverReport:
    """What the drill saw."""

    runs: int = 0
    completed: int = 0
    wrong_outputs: int = 0
    steps_rerun: int = 0
    missing_records: int = 0
    killed_port: int = 0
    promoted_port: int = 0
    failover_s: float = 0.0
    """From the kill to a replica serving the dead master's slots (cluster ok again)."""
    runs_in_flight_on_it: int = 0
    """Runs in flight whose keys were on the killed master when it died."""
    wall_s: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every run completed with the right output, every step once, nothing missing."""
        return not self.problems and self.completed == self.runs

    def lines(self) -> list[str]:
        """The figures, one per line."""
        return [
            f"runs                      {self.runs}",
            f"completed                 {self.completed}",
            f"wrong outputs             {self.wrong_outputs}",
            f"steps run twice           {self.steps_rerun}",
            f"step records missing      {self.missing_records}",
            f"killed master             {self.killed_port} "
            f"({self.runs_in_flight_on_it} runs in flight on it)",
            f"promoted replica          {self.promoted_port} after {self.failover_s:.1f}s",
            f"wall time                 {self.wall_s:.1f}s",
            f"problems                  {len(self.problems)}",
        ]


def start_runners(
    chain: Path, url: str, log_dir: Path, concurrency: int, ids: list[str], processes: int
) -> list[subprocess.Popen[str]]:
    """Start ``processes`` runner processes (the drill's runner script), the runs ``ids`` dealt
    out round robin, each running ``concurrency`` runs at once on the store ``url``."""
    head = [sys.executable, "-c", _RUNNER, str(chain), url, str(log_dir), str(concurrency)]
    return [
        subprocess.Popen(
            [*head, *ids[n::processes]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for n in range(processes)
    ]


def collect_results(
    procs: list[subprocess.Popen[str]], problems: list[str]
) -> dict[str, dict[str, Any]]:
    """Wait for the runner processes; each run's result row by run id. A runner that exits
    non-zero adds a line to ``problems``."""
    results: dict[str, dict[str, Any]] = {}
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            problems.append(f"runner exited {proc.returncode}: {err.strip()[-500:]}")
        for line in out.splitlines():
            row = json.loads(line)
            results[row["run_id"]] = row
    return results


def stop_runners(procs: list[subprocess.Popen[str]]) -> None:
    """Kill the runner processes still running and reap them."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def failover_drill(
    cluster: LocalCluster,
    *,
    chain: Path,
    log_dir: Path,
    runs: int = 200,
    processes: int = 4,
    concurrency: int = 5,
    kill_at: float = 0.3,
    steps: int = 10,
    retry_for_s: float = 30.0,
) -> FailoverReport:
    """Run the drill (see the module docstring) and judge every run."""
    report = FailoverReport(runs=runs)
    url = f"{cluster.url}?retry_for_s={retry_for_s:g}"
    ids = [f"fo-{os.getpid()}-{i}" for i in range(runs)]
    t0 = time.monotonic()
    procs = start_runners(chain, url, log_dir, concurrency, ids, processes)
    try:
        _kill_a_master_midway(cluster, report, ids, log_dir, int(runs * kill_at), steps)
        results = collect_results(procs, report.problems)
    finally:
        stop_runners(procs)
    report.wall_s = time.monotonic() - t0
    asyncio.run(_judge(cluster.url, ids, results, log_dir, steps, report))
    return report


def _kill_a_master_midway(
    cluster: LocalCluster,
    report: FailoverReport,
    ids: list[str],
    log_dir: Path,
    after_completed: int,
    steps: int,
) -> None:
    """Wait until ``after_completed`` runs logged their last step, then kill the master that
    serves the most runs in flight, and wait for its replica to take over."""
    last = f"s{steps - 1:02d}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        done, started = 0, []
        for run_id in ids:
            path = log_dir / f"{run_id}.jsonl"
            if path.exists():
                text = path.read_text(encoding="utf-8")
                if f'"step": "{last}"' in text:
                    done += 1
                else:
                    started.append(run_id)
        if done >= after_completed and started:
            break
        time.sleep(0.05)
    else:
        raise RuntimeError(f"the drill's runs did not get going: {done} completed in 300 s")
    by_master: dict[int, int] = {}
    masters = cluster.masters()
    for run_id in started:
        port = cluster.master_of(f"chainrt:{{{run_id}}}:run", masters)
        by_master[port] = by_master.get(port, 0) + 1
    port = max(by_master, key=lambda p: by_master[p])
    slots = masters[port]
    report.killed_port, report.runs_in_flight_on_it = port, by_master[port]
    killed_at = time.monotonic()
    cluster.kill(port)
    report.promoted_port = cluster.wait_failover(port, slots, timeout_s=60)
    report.failover_s = time.monotonic() - killed_at


async def _judge(
    url: str,
    ids: list[str],
    results: dict[str, dict[str, Any]],
    log_dir: Path,
    steps: int,
    report: FailoverReport,
) -> None:
    store = open_store(url)
    want_steps = {f"s{i:02d}" for i in range(steps)}
    try:
        for run_id in ids:
            row = results.get(run_id)
            if row is None or row["status"] != "completed":
                report.problems.append(f"{run_id}: runner said {row}")
            try:
                run = await store.get_run(run_id)
                records = await store.get_steps(run_id)
            except RunNotFound:
                report.problems.append(f"{run_id}: not in the store")
                continue
            if run.status == "completed":
                report.completed += 1
            if run.output != expected_output(run_id, steps):
                report.wrong_outputs += 1
                report.problems.append(f"{run_id}: status {run.status}, output {run.output!r}")
            missing = want_steps - set(records)
            if missing:
                report.missing_records += len(missing)
                report.problems.append(f"{run_id}: no record of steps {sorted(missing)}")
            executions, unreadable = read_log(log_dir / f"{run_id}.jsonl")
            report.problems += unreadable
            seen: dict[str, int] = {}
            for e in executions:
                seen[e.step] = seen.get(e.step, 0) + 1
            for step_id, count in sorted(seen.items()):
                if count > 1:
                    report.steps_rerun += count - 1
                    report.problems.append(f"{run_id}: step {step_id} ran {count} times")
    finally:
        await store.close()
