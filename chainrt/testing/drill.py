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
import hashlib
import json
import os
import random
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import RunNotFound
from ..store import OwnerLease, StepRecord, open_store
from ._drill_procs import ForkServer, SpawnRequest, run_cli

__all__ = [
    "STEP_COUNT",
    "Drill",
    "DrillOptions",
    "DrillStats",
    "Execution",
    "Process",
    "RunReport",
    "chain_yaml",
    "expected_output",
    "next_value",
    "read_log",
    "verify_run",
]

STEP_COUNT = 60
"""Steps of the drill chain."""
_CLOCK_SLACK_S = 0.005  # a record's timings come from perf_counter, the log's from time.time


def next_value(prev: Any, step_id: str) -> dict[str, Any]:
    """The output of drill step ``step_id`` given the previous step's output (or the seed)."""
    count, digest = (prev["n"], prev["h"]) if isinstance(prev, dict) else (0, str(prev))
    digest = hashlib.sha256(f"{digest}|{step_id}".encode()).hexdigest()[:16]
    return {"n": count + 1, "h": digest, "step": step_id}


def _step_ids(steps: int) -> list[str]:
    return [f"s{i:02d}" for i in range(steps)]


def expected_output(seed: str, steps: int = STEP_COUNT) -> dict[str, Any]:
    """The drill chain's output for ``seed`` when every step ran on the right input."""
    value: Any = seed
    for step_id in _step_ids(steps):
        value = next_value(value, step_id)
    return dict(value)


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
    for i, step_id in enumerate(_step_ids(steps)):
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


_MAX_EARLY_KILLS = 8
"""Kills before the run exists that one drilled run allows (then its process is left alone)."""


@dataclass
class Process:
    """One runner process of a drilled run, and what the store held right after it ended."""

    index: int
    pid: int
    mode: str
    """``run`` or ``resume``."""
    cli: bool
    killed: bool
    code: int | None
    started_at: float
    ended_at: float
    status: str | None = None
    """The run's status after this process ended (None: the run did not exist yet)."""
    recorded: frozenset[str] = frozenset()
    """Step ids with a record after this process ended."""
    owner: OwnerLease | None = None
    """The owner lease after this process ended."""


@dataclass(frozen=True)
class Execution:
    """One call of a drill tool, as its log line says."""

    step: str
    pid: int
    attempt: int
    t: float
    key: str


@dataclass
class RunReport:
    """The verdict on one drilled run."""

    run_id: str
    processes: list[Process]
    status: str | None
    output_ok: bool
    problems: list[str] = field(default_factory=list)
    reruns_after_record: int = 0
    inflight_reruns: int = 0
    """Runs of steps beyond their first (each one the re-run of a step in flight at a kill)."""
    max_step_runs: int = 0
    takeovers_before_expiry: int = 0
    takeovers_after_expiry: int = 0

    @property
    def kills(self) -> int:
        """Processes of this run killed with SIGKILL."""
        return sum(p.killed for p in self.processes)

    @property
    def kills_before_create(self) -> int:
        """Kills that landed before the run existed in the store (during start-up)."""
        return sum(p.killed and p.status is None for p in self.processes)

    @property
    def resumes(self) -> int:
        """Processes of this run that resumed it."""
        return sum(p.mode == "resume" for p in self.processes)


@dataclass
class DrillStats:
    """Counts over many drilled runs (what ``bench/chaos.py`` prints)."""

    runs: int = 0
    runs_resumed: int = 0
    kills: int = 0
    kills_before_create: int = 0
    resumes: int = 0
    cli_processes: int = 0
    completed: int = 0
    wrong_outputs: int = 0
    reruns_after_record: int = 0
    inflight_reruns: int = 0
    max_step_runs: int = 0
    takeovers_before_expiry: int = 0
    takeovers_after_expiry: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, report: RunReport) -> None:
        """Count one run in."""
        self.runs += 1
        self.runs_resumed += report.resumes > 0
        self.kills += report.kills
        self.kills_before_create += report.kills_before_create
        self.resumes += report.resumes
        self.cli_processes += sum(p.cli for p in report.processes)
        self.completed += report.status == "completed"
        self.wrong_outputs += report.status == "completed" and not report.output_ok
        self.reruns_after_record += report.reruns_after_record
        self.inflight_reruns += report.inflight_reruns
        self.max_step_runs = max(self.max_step_runs, report.max_step_runs)
        self.takeovers_before_expiry += report.takeovers_before_expiry
        self.takeovers_after_expiry += report.takeovers_after_expiry
        self.problems += [f"{report.run_id}: {p}" for p in report.problems]

    @property
    def ok(self) -> bool:
        """Every run completed with the right output and nothing broke an invariant."""
        return not self.problems and self.completed == self.runs

    def lines(self) -> list[str]:
        """The counts, one per line."""
        return [
            f"runs                       {self.runs} ({self.runs_resumed} killed and resumed)",
            f"kills (SIGKILL)            {self.kills} ({self.kills_before_create} before the run existed)",
            f"resumes                    {self.resumes} ({self.cli_processes} CLI processes)",
            f"completed                  {self.completed}",
            f"wrong outputs              {self.wrong_outputs}",
            f"steps re-run after record  {self.reruns_after_record}",
            f"in-flight steps re-run     {self.inflight_reruns} (at most one per kill)",
            f"max runs of one step       {self.max_step_runs} (1 + kills that caught it in flight)",
            f"takeovers before expiry    {self.takeovers_before_expiry} (dead pid seen)",
            f"takeovers after expiry     {self.takeovers_after_expiry}",
            f"problems                   {len(self.problems)}",
        ]


def verify_run(
    run_id: str,
    seed: str,
    processes: list[Process],
    executions: list[Execution],
    records: dict[str, StepRecord],
    status: str | None,
    output: Any,
    *,
    steps: int = STEP_COUNT,
    lease_expiry_only: bool = False,
) -> RunReport:
    """Judge one drilled run from its processes, its step log and its final records (no I/O)."""
    report = RunReport(run_id, processes, status, output == expected_output(seed, steps))
    problems = report.problems
    if status != "completed":
        problems.append(f"ended {status}, not completed")
    elif not report.output_ok:
        problems.append(f"wrong output {output!r}")
    if status == "completed" and set(records) != set(_step_ids(steps)):
        problems.append(f"{len(records)} step records, not {steps}")
    by_pid = {p.pid: p for p in processes}
    runs: dict[str, list[Execution]] = defaultdict(list)
    for e in executions:
        if e.pid not in by_pid:
            problems.append(f"step {e.step} ran in pid {e.pid}, no process of this run")
        elif e.key != f"{run_id}:{e.step}" or e.attempt != 1:
            problems.append(f"step {e.step} saw key {e.key!r}, attempt {e.attempt}")
        else:
            runs[e.step].append(e)
    for step_id, calls in runs.items():
        calls.sort(key=lambda e: e.t)
        report.max_step_runs = max(report.max_step_runs, len(calls))
        report.inflight_reruns += len(calls) - 1
        if len({e.pid for e in calls}) != len(calls):
            problems.append(f"step {step_id} ran twice in one process")
        for e in calls:
            index = by_pid[e.pid].index
            if any(p.killed and p.index < index and step_id in p.recorded for p in processes):
                report.reruns_after_record += 1
                problems.append(f"step {step_id} ran again in pid {e.pid} after its record")
        for e in calls[:-1]:
            proc = by_pid[e.pid]
            if not proc.killed or step_id in proc.recorded:
                problems.append(f"step {step_id} ran again after pid {e.pid} ran it to its end")
        rec = records.get(step_id)
        last = calls[-1].t
        if rec is not None and not (
            rec.started_at - _CLOCK_SLACK_S <= last <= rec.finished_at + _CLOCK_SLACK_S
        ):
            problems.append(f"the record of step {step_id} is not from its last run")
    for step_id in set(records) - set(runs):
        problems.append(f"step {step_id} has a record but never ran")
    for proc in processes:  # steps run one at a time: a kill catches at most one in flight
        unrecorded = {e.step for e in executions if e.pid == proc.pid} - proc.recorded
        if proc.killed and len(unrecorded) > 1:
            problems.append(f"pid {proc.pid} was killed with {sorted(unrecorded)} unrecorded")
    _judge_takeovers(report, runs, lease_expiry_only)
    return report


def _judge_takeovers(
    report: RunReport, runs: dict[str, list[Execution]], lease_expiry_only: bool
) -> None:
    """Did each process that ran a step take the run over before its dead owner's lease ran out?"""
    first: dict[int, float] = {}
    for calls in runs.values():
        for e in calls:
            first[e.pid] = min(first.get(e.pid, e.t), e.t)
    for prev, proc in zip(report.processes, report.processes[1:], strict=False):
        lease, started = prev.owner, first.get(proc.pid)
        if lease is None or started is None or lease.pid == proc.pid:
            continue
        if started < lease.expires_at:
            report.takeovers_before_expiry += 1
            if lease_expiry_only:
                report.problems.append(
                    f"pid {proc.pid} took the run over from {lease.host}:{lease.pid} "
                    f"{lease.expires_at - started:.3f}s before its lease expired"
                )
        else:
            report.takeovers_after_expiry += 1


def read_log(path: Path) -> tuple[list[Execution], list[str]]:
    """The executions a step log records, and a problem per line that does not parse."""
    if not path.exists():
        return [], []
    executions, problems = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            raw = json.loads(line)
            executions.append(
                Execution(
                    str(raw["step"]),
                    int(raw["pid"]),
                    int(raw["attempt"]),
                    float(raw["t"]),
                    str(raw["key"]),
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            problems.append(f"{path.name}:{number}: unreadable log line ({exc})")
    return executions, problems


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
                kill_after = self.rng.uniform(0.0, max(steps_s, 0.01))
            else:
                kill_after = self.rng.uniform(low, full_s)
            mode = "run" if status is None else "resume"
            proc = self._spawn(len(processes), mode, run_id, seed, kill_after, cli)
            processes.append(proc)
            status = proc.status
            if mode == "run" and status == "completed" and not proc.killed:
                # A whole run went faster than measured: draw later kills over that time.
                self._timing[cli] = (start_s, min(full_s, proc.ended_at - proc.started_at))
            if status == "completed" or not proc.killed:
                break
            if status is None and kill_after is not None:
                # The run starts later than measured: so do its steps and its end.
                early += 1
                low = max(low, kill_after)
                full_s = max(full_s, low + steps_s)
        return self._verify(run_id, seed, processes)

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
        proc.status, proc.owner, proc.recorded = run.status, run.owner, frozenset(steps)
        return proc


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
