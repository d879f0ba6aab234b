"""The crash drill's verdict: the drill chain's expected values and the checks on a drilled run.

``verify_run`` judges one drilled run from its processes, the step log its tools wrote
(``read_log``) and its final records, with no I/O; ``DrillStats`` counts the verdicts over many
runs. ``chainrt.testing.drill`` drives the runs and re-exports every public name here.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..store import OwnerLease, StepRecord

__all__ = [
    "STEP_COUNT",
    "DrillStats",
    "Execution",
    "FlowCheck",
    "Process",
    "RunReport",
    "expected_output",
    "next_value",
    "read_log",
    "step_ids",
    "verify_run",
]

STEP_COUNT = 60
"""Steps of the drill chain."""
_CLOCK_SLACK_S = 0.005  # a record's timings come from perf_counter, the log's from time.time


def next_value(prev: Any, step_id: str) -> dict[str, Any]:
    """The output of drill step ``step_id`` given the previous step's output (or the seed)."""
    if isinstance(prev, dict) and "n" in prev and "h" in prev:
        count, digest = prev["n"], prev["h"]
    else:  # the seed, or a group's output (a dict of branches, a list of items): folded whole
        count = 0
        digest = prev if isinstance(prev, str) else json.dumps(prev, sort_keys=True)
    digest = hashlib.sha256(f"{digest}|{step_id}".encode()).hexdigest()[:16]
    return {"n": count + 1, "h": digest, "step": step_id}


def step_ids(steps: int) -> list[str]:
    """The drill chain's step ids, in order."""
    return [f"s{i:02d}" for i in range(steps)]


def expected_output(seed: str, steps: int = STEP_COUNT) -> dict[str, Any]:
    """The drill chain's output for ``seed`` when every step ran on the right input."""
    value: Any = seed
    for step_id in step_ids(steps):
        value = next_value(value, step_id)
    return dict(value)


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
    choices: dict[str, Any] = field(default_factory=dict)
    """The switch choices recorded after this process ended (``<path>#branch``: branch name)."""


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
    branch_changes: int = 0
    """Switch choices that differ from the one the seed implies, after some process."""

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
    branch_changes: int = 0
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
        self.branch_changes += report.branch_changes
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
            f"switch branch changes      {self.branch_changes}",
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
    flow: FlowCheck | None = None,
) -> RunReport:
    """Judge one drilled run from its processes, its step log and its final records (no I/O).

    Without ``flow`` the run is of the straight drill chain of ``steps`` steps; with it, of a
    chain with groups, judged by the leaf steps' paths and the expected switch choices."""
    ok = output in flow.outputs if flow else output == expected_output(seed, steps)
    report = RunReport(run_id, processes, status, ok)
    problems = report.problems
    if status != "completed":
        problems.append(f"ended {status}, not completed")
    elif not report.output_ok:
        problems.append(f"wrong output {output!r}")
    if flow is not None:
        _judge_choices(report, records, flow.choices)
        done = {k for k in records if k in flow.leaves and records[k].status == "completed"}
        if status == "completed" and not flow.required <= done:
            problems.append(f"no completed record of {sorted(flow.required - done)}")
        records = {k: rec for k, rec in records.items() if k in flow.leaves}
    elif status == "completed" and set(records) != set(step_ids(steps)):
        problems.append(f"{len(records)} step records, not {steps}")
    by_pid = {p.pid: p for p in processes}
    runs: dict[str, list[Execution]] = defaultdict(list)
    for e in executions:
        if e.pid not in by_pid:
            problems.append(f"step {e.step} ran in pid {e.pid}, no process of this run")
        elif e.key != f"{run_id}:{e.step}" or e.attempt < 1:
            problems.append(f"step {e.step} saw key {e.key!r}, attempt {e.attempt}")
        else:
            runs[e.step].append(e)
    for step_id, calls in runs.items():
        calls.sort(key=lambda e: e.t)
        report.max_step_runs = max(report.max_step_runs, len(calls))
        report.inflight_reruns += len(calls) - 1
        if len({e.pid for e in calls}) != len(calls):
            problems.append(f"step {step_id} ran twice in one process")
        # ctx.attempt counts on across crashes (written before each call): a re-run is never
        # told it is an attempt it already was.
        for before, after in itertools.pairwise(calls):
            if after.attempt <= before.attempt:
                problems.append(
                    f"step {step_id} re-ran as attempt {after.attempt} after attempt "
                    f"{before.attempt}"
                )
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
        if rec is not None and not _from_last_run(rec, calls[-1].t):
            problems.append(f"the record of step {step_id} is not from its last run")
    for step_id in set(records) - set(runs):
        if records[step_id].status != "cancelled":
            problems.append(f"step {step_id} has a record but never ran")
    inflight = flow.max_inflight if flow else 1
    for proc in processes:  # a kill catches at most the steps that run at once in flight
        unrecorded = {e.step for e in executions if e.pid == proc.pid} - proc.recorded
        if proc.killed and len(unrecorded) > inflight:
            problems.append(f"pid {proc.pid} was killed with {sorted(unrecorded)} unrecorded")
    _judge_takeovers(report, runs, lease_expiry_only)
    return report


def _from_last_run(rec: StepRecord, last: float) -> bool:
    """Is ``rec`` the record of the step's run at ``last`` (unix seconds)?

    A record written by a run spans it. A ``cancelled`` record (a join, or a cancel, cut the
    step) says only that the step ended there: it may have been cut before its call (then its
    last run was an earlier execution's, one a crash cut), so its run lies before its end."""
    if rec.status == "cancelled":
        return last <= rec.finished_at + _CLOCK_SLACK_S
    return rec.started_at - _CLOCK_SLACK_S <= last <= rec.finished_at + _CLOCK_SLACK_S


@dataclass(frozen=True)
class FlowCheck:
    """What a drilled run of a chain with groups must show (see ``chainrt.testing._drill_flow``)."""

    outputs: list[Any]
    """The acceptable outputs (more than one where a join on ``any`` may be won by either)."""
    leaves: frozenset[str]
    """Every leaf step path of the chain: other records (groups, choices) are not step runs."""
    required: frozenset[str]
    """Leaf step paths that a completed run must have a completed record of."""
    choices: dict[str, str]
    """The switch choices the seed implies: ``<path>#branch`` to the branch name."""
    max_inflight: int
    """Leaf steps that run at once at most (what one kill may catch in flight)."""


def _judge_choices(
    report: RunReport, records: dict[str, StepRecord], choices: dict[str, str]
) -> None:
    """Was every switch choice, after every process and at the end, the one the seed implies?"""
    seen = [(f"after pid {p.pid}", p.choices) for p in report.processes]
    seen.append(("at the end", {k: r.output for k, r in records.items() if k in choices}))
    for when, recorded in seen:
        for key, branch in recorded.items():
            if key in choices and branch != choices[key]:
                report.branch_changes += 1
                report.problems.append(f"{key} was {branch!r} {when}, not {choices[key]!r}")


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
