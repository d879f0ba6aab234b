"""The crash drill: ``kill -9`` a runner at random moments, resume the run until it completes, verify.

Shared by ``tests/test_crash_drill.py`` (tens of runs in CI) and ``bench/chaos.py`` (thousands)::

    with Drill(DrillOptions(chain=Path("tests/data/drill/chain.yaml"), store_url=url,
                            log_dir=tmp)) as drill:
        stats = drill.run_many(30)
    assert stats.ok, stats.problems

One drilled run: a runner process starts the run and is killed with SIGKILL after a delay drawn
over a whole run's duration; a new process resumes it (and may be killed too), until the run
completes. After each kill the drill notes which step records exist and the owner lease. Then
:func:`verify_run` checks, from the step log the drill chain's tools write (one line per call,
before the call does anything) and the records: the run completed with the expected output; no
step ran again after its record was written; every extra run of a step was in a process killed
while that step was in flight (so one crash costs at most one re-run); the record of a step is
from its last run; and, with ``foreign_hosts``, no process took a run over before the dead
owner's lease expired.

Runner processes come from a fork server that imports chainrt once and forks a child per
process, so a runner starts in milliseconds instead of the half second a fresh interpreter
needs (see ``_drill_procs``); ``cli=True`` starts the real CLI (``python -m chainrt run|resume
... --json``) instead. A CLI process's start-up varies by seconds on a loaded machine, far more
than the drill chain's steps take, so its kill moment is counted from its first step.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from .._errors import RunNotFound
from ..spec._flow import CHOICE_SUFFIX
from ..store import open_store
from ._drill_procs import ForkServer, SpawnRequest, run_cli
from ._drill_verify import (
    STEP_COUNT,
    DrillStats,
    Execution,
    FlowCheck,
    Process,
    RunReport,
    expected_output,
    next_value,
    read_log,
    step_ids,
    verify_run,
)

__all__ = [
    "STEP_COUNT",
    "Drill",
    "DrillOptions",
    "DrillStats",
    "Execution",
    "FlowCheck",
    "Process",
    "RunReport",
    "chain_yaml",
    "expected_output",
    "next_value",
    "read_log",
    "verify_run",
]


def chain_yaml(steps: int = STEP_COUNT, *, sleep_ms: int | None = None, budget: str = "10m") -> str:
    """The drill chain: ``steps`` steps, sync and async alternating, each fed the last one's
    output. A step waits ``sleep_ms`` (default 1-4 ms, varying) after logging its call."""
    call = f"{steps}" + ("" if sleep_ms is None else f" {sleep_ms} {budget}")
    lines = [
        "# A crash-drill chain, generated: edit chainrt.testing.drill.chain_yaml, then run",
        f"#   python -m chainrt.testing.drill chain {call} > THIS_FILE",
        "name: crash_drill",
        "description: Fast steps, each fed the previous output, for kill -9 drills",
        f"budget: {budget}",
        "inputs:",
        "  seed: str",
        "  log_dir: str",
        "steps:",
    ]
    prev = "input.seed"
    for i, step_id in enumerate(step_ids(steps)):
        tool = "step_async" if i % 2 else "step_sync"
        wait = 1 + i % 4 if sleep_ms is None else sleep_ms
        lines += [
            f"  - id: {step_id}",
            f"    tool: tools.py:{tool}",
            f'    args: {{prev: "{{{{ {prev} }}}}", sleep_ms: {wait}, '
            'log_dir: "{{ input.log_dir }}"}',
        ]
        prev = f"steps.{step_id}.output"
    lines.append(f'output: "{{{{ {prev} }}}}"')
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class DrillOptions:
    """What a drill runs against and how its runner processes die."""

    chain: Path
    """The drill chain (``tests/data/drill/chain.yaml``); its tools write the step log."""
    store_url: str
    log_dir: Path
    """Where the step logs (``<run_id>.jsonl``) and runner stderr (``<run_id>.err``) go."""
    lease_ttl_s: float = 10.0
    """``CHAINRT_LEASE_TTL_S`` of the runner processes."""
    foreign_hosts: bool = False
    """Each runner process claims its own host name, as if every one ran on another machine:
    a dead owner is then found only by its lease expiring (fork server only)."""
    max_kills: int = 6
    """Kills per run at most; after that the run is left to finish."""
    resume_kill_chance: float = 0.5
    """Chance that a resuming process is killed too (the first process always is)."""
    steps: int = STEP_COUNT
    flow: bool = False
    """The chain is the flow drill chain (``tests/data/drill/flow.yaml``: switch, parallel
    joined on all and on any, map), judged by ``chainrt.testing._drill_flow``."""


_MAX_EARLY_KILLS = 8
"""Kills before the run exists that one drilled run allows (then its process is left alone)."""


class Drill:
    """Drives drilled runs against one store; use it as a context manager (it owns a fork server).

    One Drill is one sequence of runs (not thread-safe); run several Drills for parallel drills.
    """

    def __init__(self, options: DrillOptions, *, seed: int = 0) -> None:
        self.options = options
        self.rng = random.Random(seed)
        self._seed = seed
        self._loop = asyncio.Runner()
        self._store = open_store(options.store_url)
        self._server = ForkServer(options.chain)
        self._timing: dict[bool, tuple[float, float]] = {}
        self._cli_steps_s: float | None = None  # first step to last, in a whole CLI run
        self._count = 0

    def __enter__(self) -> Drill:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the fork server and close the store."""
        self._server.close()
        self._loop.run(self._store.close())
        self._loop.close()

    def run_many(self, resumed_runs: int, *, cli: bool = False) -> DrillStats:
        """Drill until ``resumed_runs`` runs were killed and resumed (at most 3x as many runs)."""
        stats = DrillStats()
        while stats.runs_resumed < resumed_runs and stats.runs < 3 * resumed_runs:
            stats.add(self.run_one(cli=cli))
        return stats

    def run_one(self, *, cli: bool = False) -> RunReport:
        """Start one run, kill and resume it until it completes (or a process fails), verify it."""
        opts = self.options
        self._count += 1
        run_id = f"drill-{self._seed}-{self._count}-{self.rng.getrandbits(32):08x}"
        seed = f"{run_id}/{self.rng.random()}"
        start_s, full_s = self._durations(cli)
        processes: list[Process] = []
        status: str | None = None
        # Kill moments are drawn over a whole run, start-up mostly left out: a kill before the
        # run exists tests little. A kill that still came too early raises the lower bound.
        low = 0.8 * start_s
        steps_s = max(full_s - start_s, 0.0)
        early = 0  # kills that came before the run existed
        while True:
            # Kills before the run exists test little, so they do not use up max_kills; a few
            # are allowed (a busy machine starts processes slower than calibrated), then none.
            kills = sum(p.killed for p in processes) - early
            chance = 1.0 if status is None else opts.resume_kill_chance
            kill = (
                kills < opts.max_kills and early < _MAX_EARLY_KILLS and self.rng.random() < chance
            )
            if not kill:
                kill_after = None
            elif cli:  # counted from the process's first step (see run_cli)
                kill_after = self.rng.uniform(0.0, max(self._cli_steps(), 0.01))
            else:
                kill_after = self.rng.uniform(low, full_s)
            mode = "run" if status is None else "resume"
            proc = self._spawn(len(processes), mode, run_id, seed, kill_after, cli)
            processes.append(proc)
            status = proc.status
            if mode == "run" and status == "completed" and cli:
                # The kill came after the last step (or none was drawn): draw later kills over
                # the steps as this run took them, when they went faster than measured.
                self._cli_steps_s = min(self._cli_steps(), self._steps_span(run_id, proc.pid))
            elif mode == "run" and status == "completed" and not proc.killed:
                # A whole run went faster than measured: draw later kills over that time. Its
                # start-up too (the calibration run may have paid a cold start): else, in a short
                # chain, the lower bound of the kill moment stays past the run's end.
                first = self._first_step(run_id, proc.pid)
                start = start_s if first is None else min(start_s, first - proc.started_at)
                self._timing[cli] = (start, min(full_s, proc.ended_at - proc.started_at))
            if status == "completed" or not proc.killed:
                break
            if status is None and kill_after is not None:
                # The run starts later than measured: so do its steps and its end.
                early += 1
                low = max(low, kill_after)
                full_s = max(full_s, low + steps_s)
        return self._verify(run_id, seed, processes)

    def _cli_steps(self) -> float:
        """Seconds from a CLI process's first step to its last, in a whole run: the window its
        kill moment is drawn over. Not the time to the process's end: a CLI process still
        writes the run's end and tears its interpreter down after its last step (a large share
        on a loaded machine), and a kill there finds the run complete, with nothing to resume."""
        if self._cli_steps_s is None:
            self._durations(True)
        assert self._cli_steps_s is not None
        return self._cli_steps_s

    def _first_step(self, run_id: str, pid: int) -> float | None:
        """When process ``pid`` made its first step call (unix seconds), from the step log."""
        executions, _ = read_log(self.options.log_dir / f"{run_id}.jsonl")
        return min((e.t for e in executions if e.pid == pid), default=None)

    def _steps_span(self, run_id: str, pid: int) -> float:
        """Seconds from process ``pid``'s first step call to its last, from the run's step log."""
        executions, _ = read_log(self.options.log_dir / f"{run_id}.jsonl")
        times = [e.t for e in executions if e.pid == pid]
        return max(times) - min(times) if times else 0.0

    def _durations(self, cli: bool) -> tuple[float, float]:
        """Seconds from a process's start to its first step and to its end, for one whole run
        (measured once per kind of process)."""
        if cli not in self._timing:
            run_id = f"drill-calibrate-{self._seed}-{'cli' if cli else 'fork'}-{os.getpid()}"
            proc = self._spawn(0, "run", run_id, run_id, None, cli)
            report = self._verify(run_id, run_id, [proc])
            if report.problems:
                raise RuntimeError(f"the drill's calibration run failed: {report.problems}")
            executions, _ = read_log(self.options.log_dir / f"{run_id}.jsonl")
            first = min(e.t for e in executions)
            self._timing[cli] = (first - proc.started_at, proc.ended_at - proc.started_at)
            if cli:
                self._cli_steps_s = self._steps_span(run_id, proc.pid)
        return self._timing[cli]

    def _verify(self, run_id: str, seed: str, processes: list[Process]) -> RunReport:
        executions, log_problems = read_log(self.options.log_dir / f"{run_id}.jsonl")
        try:
            run = self._loop.run(self._store.get_run(run_id))
            records = self._loop.run(self._store.get_steps(run_id))
            status, output = run.status, run.output
        except RunNotFound:
            records, status, output = {}, None, None
        report = verify_run(
            run_id,
            seed,
            processes,
            executions,
            records,
            status,
            output,
            steps=self.options.steps,
            lease_expiry_only=self.options.foreign_hosts,
            flow=_flow_check(seed) if self.options.flow else None,
        )
        report.problems += log_problems
        if status != "completed":
            err = self.options.log_dir / f"{run_id}.err"
            if err.exists():
                report.problems += err.read_text(errors="replace").strip().splitlines()[-3:]
        return report

    def _spawn(
        self, index: int, mode: str, run_id: str, seed: str, kill_after: float | None, cli: bool
    ) -> Process:
        request = SpawnRequest(
            mode=mode,
            run_id=run_id,
            input={"seed": seed, "log_dir": str(self.options.log_dir)},
            store=self.options.store_url,
            lease_ttl_s=self.options.lease_ttl_s,
            foreign_host=self.options.foreign_hosts,
            kill_after=kill_after,
            err=str(self.options.log_dir / f"{run_id}.err"),
            from_first_step=cli,
        )
        reply = run_cli(self.options.chain, request) if cli else self._server.spawn(request)
        proc = Process(
            index,
            reply["pid"],
            mode,
            cli,
            reply["killed"],
            reply["code"],
            reply["started_at"],
            reply["ended_at"],
        )
        try:
            run = self._loop.run(self._store.get_run(run_id))
            steps = self._loop.run(self._store.get_steps(run_id))
        except RunNotFound:
            return proc
        # A `running` record marks an attempt begun, not a step done (a re-run counts on from it).
        done = frozenset(k for k, rec in steps.items() if rec.status != "running")
        proc.status, proc.owner, proc.recorded = run.status, run.owner, done
        proc.choices = {k: rec.output for k, rec in steps.items() if k.endswith(CHOICE_SUFFIX)}
        return proc


def _flow_check(seed: str) -> FlowCheck:
    """The flow drill chain's verdict inputs for ``seed``."""
    from ._drill_flow import FLOW_LEAVES, FLOW_MAX_INFLIGHT, flow_expectation

    expect = flow_expectation(seed)
    return FlowCheck(
        outputs=expect.outputs,
        leaves=FLOW_LEAVES,
        required=expect.required,
        choices={"route" + CHOICE_SUFFIX: expect.branch},
        max_inflight=FLOW_MAX_INFLIGHT,
    )


def main(argv: list[str] | None = None) -> None:
    """``python -m chainrt.testing.drill chain [STEPS [SLEEP_MS BUDGET]]``: print a drill chain."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] != ["chain"] or len(args) not in (1, 2, 4):
        sys.exit("usage: python -m chainrt.testing.drill chain [STEPS [SLEEP_MS BUDGET]]")
    steps = int(args[1]) if len(args) > 1 else STEP_COUNT
    if len(args) == 4:
        sys.stdout.write(chain_yaml(steps, sleep_ms=int(args[2]), budget=args[3]))
    else:
        sys.stdout.write(chain_yaml(steps))


if __name__ == "__main__":
    main()
