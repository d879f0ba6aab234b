"""The crash drill: runners killed with ``kill -9`` at random moments, runs resumed.

Every drilled run must complete with the right output; no step whose record was written runs
again; every extra run of a step is the re-run of a step in flight at a kill (one per crash).
The first tests check that the verifier itself catches each kind of violation.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from chainrt.spec import load_spec, spec_from_dict
from chainrt.store import OwnerLease, StepRecord
from chainrt.testing.drill import (
    STEP_COUNT,
    Drill,
    DrillOptions,
    DrillStats,
    Execution,
    Process,
    chain_yaml,
    expected_output,
    next_value,
    verify_run,
)

CHAIN = Path(__file__).parent / "data" / "drill" / "chain.yaml"
RUN = "r1"
SEED = "seed-1"
STEPS = [f"s{i:02d}" for i in range(STEP_COUNT)]


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("chain.yaml", {}),
        ("fencing.yaml", {"steps": 6, "sleep_ms": 200, "budget": "60s"}),
        ("slow.yaml", {"steps": 20, "sleep_ms": 50, "budget": "30s"}),
        ("ten.yaml", {"steps": 10, "sleep_ms": 20, "budget": "10m"}),
    ],
)
def test_chain_files_are_the_generated_chains(name: str, kwargs: dict[str, Any]) -> None:
    assert (CHAIN.parent / name).read_text() == chain_yaml(**kwargs)


def test_drill_chain_has_sync_and_async_steps_fed_by_the_last() -> None:
    spec = load_spec(CHAIN).spec
    assert [s.id for s in spec.steps] == STEPS
    assert spec.steps[0].args["prev"] == "{{ input.seed }}"
    for prev, step in zip(spec.steps, spec.steps[1:], strict=False):
        assert step.args["prev"] == f"{{{{ steps.{prev.id}.output }}}}"
    assert spec.output == f"{{{{ steps.{STEPS[-1]}.output }}}}"
    assert {s.tool for s in spec.steps} == {"tools.py:step_sync", "tools.py:step_async"}
    assert spec_from_dict(spec.model_dump(mode="json", by_alias=True)) == spec


def test_expected_output_depends_on_every_step_and_the_seed() -> None:
    out = expected_output(SEED)
    assert out["n"] == STEP_COUNT
    assert out["step"] == STEPS[-1]
    assert expected_output("other")["h"] != out["h"]
    stale: Any = SEED
    for i, step_id in enumerate(STEPS):  # a resume that fed s30 a stale input (s00's output)
        stale = next_value(stale if i != 30 else next_value(SEED, "s00"), step_id)
    assert stale["n"] != out["n"]
    assert stale != out


# ---------------------------------------------------------------------------- the verifier


def _history(crash_at: int = 20) -> tuple[list[Process], list[Execution], dict[str, StepRecord]]:
    """A correct history: pid 100 is killed while step ``crash_at`` is in flight, pid 200
    resumes, re-runs that step and finishes."""
    lease = OwnerLease(host="h", pid=100, token=1, expires_at=1000.0 + 10)
    first = Process(0, 100, "run", False, True, None, 999.0, 1000.0, "running")
    first.recorded, first.owner = frozenset(STEPS[:crash_at]), lease
    second = Process(1, 200, "resume", False, False, 0, 1000.0, 1002.0, "completed")
    executions, records = [], {}
    t = 999.5
    for i, step_id in enumerate(STEPS):
        pids = [100] if i < crash_at else [100, 200] if i == crash_at else [200]
        for pid in pids:
            t += 0.01 if pid == 100 or i > crash_at else 0.5
            attempt = 2 if pid == 200 and i == crash_at else 1  # the re-run counts on
            executions.append(Execution(step_id, pid, attempt, t, f"{RUN}:{step_id}"))
        records[step_id] = StepRecord(
            step_id=step_id, status="completed", started_at=t - 0.001, finished_at=t + 0.003
        )
    return [first, second], executions, records


def _verify(
    processes: list[Process],
    executions: list[Execution],
    records: dict[str, StepRecord],
    *,
    output: object = None,
    expiry_only: bool = False,
) -> list[str]:
    out = expected_output(SEED) if output is None else output
    report = verify_run(
        RUN,
        SEED,
        processes,
        executions,
        records,
        "completed",
        out,
        lease_expiry_only=expiry_only,
    )
    return report.problems


def test_verifier_accepts_a_correct_history() -> None:
    processes, executions, records = _history()
    report = verify_run(
        RUN, SEED, processes, executions, records, "completed", expected_output(SEED)
    )
    assert report.problems == []
    assert report.max_step_runs == 2
    assert report.inflight_reruns == 1
    assert report.reruns_after_record == 0
    assert report.takeovers_before_expiry == 1  # pid 200 did not wait for pid 100's lease


def test_verifier_catches_a_step_run_again_after_its_record() -> None:
    processes, executions, records = _history()
    executions.append(Execution("s05", 200, 1, 1001.9, f"{RUN}:s05"))
    problems = _verify(processes, executions, records)
    assert any("s05 ran again in pid 200 after its record" in p for p in problems)


def test_verifier_catches_a_rerun_told_it_is_attempt_1_again() -> None:
    processes, executions, records = _history()
    executions[:] = [
        e if not (e.step == "s20" and e.pid == 200) else Execution("s20", 200, 1, e.t, e.key)
        for e in executions
    ]
    problems = _verify(processes, executions, records)
    assert any("s20 re-ran as attempt 1 after attempt 1" in p for p in problems)


def test_verifier_catches_a_rerun_without_a_crash() -> None:
    processes, executions, records = _history()
    processes[0].killed = False  # pid 100 ended on its own, yet step s20 ran again
    problems = _verify(processes, executions, records)
    assert any("s20 ran again after pid 100" in p for p in problems)


def test_verifier_catches_two_steps_in_flight_at_one_kill() -> None:
    processes, executions, records = _history()
    processes[0].recorded = frozenset(STEPS[:19])  # s19 ran to its end but was never written
    problems = _verify(processes, executions, records)
    assert any("killed with ['s19', 's20'] unrecorded" in p for p in problems)


def test_verifier_catches_a_wrong_output_a_stale_record_and_a_stray_pid() -> None:
    processes, executions, records = _history()
    records["s30"] = records["s30"].model_copy(update={"started_at": 1.0, "finished_at": 2.0})
    executions.append(Execution("s40", 999, 1, 1001.0, f"{RUN}:s40"))
    problems = _verify(processes, executions, records, output={"n": 59})
    assert any("wrong output" in p for p in problems)
    assert any("record of step s30 is not from its last run" in p for p in problems)
    assert any("pid 999" in p for p in problems)


def test_verifier_catches_a_takeover_of_a_live_lease() -> None:
    processes, executions, records = _history()
    problems = _verify(processes, executions, records, expiry_only=True)
    assert any("took the run over from h:100" in p for p in problems)


# ---------------------------------------------------------------------------- the drills


def _stats_message(stats: DrillStats, seed: int) -> str:
    return f"seed {seed}\n" + "\n".join(stats.lines() + stats.problems[:20])


@pytest.mark.slow
@pytest.mark.redis
def test_crash_drill_dead_owner_found_by_pid(redis_url: str, tmp_path: Path) -> None:
    """30 runs killed and resumed; the default 10 s lease is never waited for on this host."""
    seed = random.randrange(1 << 30)
    options = DrillOptions(chain=CHAIN, store_url=redis_url, log_dir=tmp_path)
    with Drill(options, seed=seed) as drill:
        stats = drill.run_many(30)
    message = _stats_message(stats, seed)
    assert stats.ok, message
    assert stats.runs_resumed >= 30, message
    assert stats.completed == stats.runs, message
    assert stats.wrong_outputs == 0, message
    assert stats.reruns_after_record == 0, message
    assert stats.kills > stats.kills_before_create, message  # kills landed mid-run
    assert stats.max_step_runs >= 2, message  # some kill caught a step in flight
    assert 0 < stats.inflight_reruns <= stats.kills - stats.kills_before_create, message
    assert stats.takeovers_before_expiry > 0, message
    assert stats.takeovers_after_expiry == 0, message  # nobody waited for the 10 s lease


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.cluster
def test_crash_drill_on_a_redis_cluster(cluster_url: str, tmp_path: Path) -> None:
    """The same drill with the store on a local Redis Cluster (runs spread over 3 masters)."""
    seed = random.randrange(1 << 30)
    options = DrillOptions(chain=CHAIN, store_url=cluster_url, log_dir=tmp_path)
    with Drill(options, seed=seed) as drill:
        stats = drill.run_many(15)
    message = _stats_message(stats, seed)
    assert stats.ok, message
    assert stats.runs_resumed >= 15, message
    assert stats.reruns_after_record == 0, message
    assert stats.kills > stats.kills_before_create, message  # kills landed mid-run
    assert 0 < stats.inflight_reruns <= stats.kills - stats.kills_before_create, message
    assert stats.takeovers_after_expiry == 0, message  # dead pids found, no lease waited for


@pytest.mark.slow
@pytest.mark.redis
def test_crash_drill_through_the_cli(redis_url: str, tmp_path: Path) -> None:
    """The same drill with real ``python -m chainrt run|resume --json`` processes."""
    seed = random.randrange(1 << 30)
    options = DrillOptions(chain=CHAIN, store_url=redis_url, log_dir=tmp_path, max_kills=4)
    with Drill(options, seed=seed) as drill:
        stats = drill.run_many(3, cli=True)
    message = _stats_message(stats, seed)
    assert stats.ok, message
    assert stats.runs_resumed >= 3, message
    assert stats.cli_processes >= stats.runs + stats.runs_resumed, message
    assert stats.takeovers_after_expiry == 0, message


@pytest.mark.slow
@pytest.mark.redis
def test_crash_drill_dead_owner_found_by_lease_expiry(redis_url: str, tmp_path: Path) -> None:
    """Each process poses as another host: a resume must wait for the dead owner's lease."""
    seed = random.randrange(1 << 30)
    options = DrillOptions(
        chain=CHAIN, store_url=redis_url, log_dir=tmp_path, lease_ttl_s=0.4, foreign_hosts=True
    )
    with Drill(options, seed=seed) as drill:
        stats = drill.run_many(6)
    message = _stats_message(stats, seed)
    assert stats.ok, message  # includes: no takeover before the lease expired
    assert stats.runs_resumed >= 6, message
    assert stats.takeovers_after_expiry > 0, message
    assert stats.takeovers_before_expiry == 0, message
