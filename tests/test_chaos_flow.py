"""The crash drill on a chain with control flow (``tests/data/drill/flow.yaml``): a switch, parallel
groups joined on all and on any, a map. Runners are killed with ``kill -9`` at random moments and
resumed; no recorded inner step may run again and the switch's recorded branch may never change.
The first tests check that the verifier catches each kind of violation."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from chainrt.store import StepRecord
from chainrt.testing._drill_flow import FLOW_LEAVES, flow_expectation, pick_value
from chainrt.testing.drill import Drill, DrillOptions, Execution, FlowCheck, Process, verify_run

CHAIN = Path(__file__).parent / "data" / "drill" / "flow.yaml"
RUN = "r1"


def _seed(branch: str) -> str:
    """A seed whose pick step chooses ``branch``."""
    return next(
        s for s in (f"seed-{i}" for i in range(200)) if flow_expectation(s).branch == branch
    )


def test_every_branch_is_picked_by_some_seed_and_implies_its_steps() -> None:
    wide, race, default = (flow_expectation(_seed(b)) for b in ("wide", "race", "default"))
    assert len(wide.outputs) == 1
    assert "route.wide.fan.b.b2" in wide.required
    assert len(race.outputs) == 2  # either branch of the any group may win
    assert race.outputs[0] != race.outputs[1]
    assert "route.race.first.fast.f1" not in race.required  # the winner is not known
    assert "route.default.each[3].m2" in default.required
    assert default.required <= FLOW_LEAVES
    pick = pick_value("x", "pick")
    assert len(pick["items"]) == 4
    assert pick != pick_value("y", "pick")


def _check(seed: str) -> FlowCheck:
    expect = flow_expectation(seed)
    return FlowCheck(
        expect.outputs, FLOW_LEAVES, expect.required, {"route#branch": expect.branch}, 2
    )


def _history(seed: str) -> tuple[list[Process], list[Execution], dict[str, StepRecord]]:
    """A correct history: pid 100 is killed after the switch chose, with a1 and b1 in flight;
    pid 200 resumes, re-runs those two and finishes."""
    steps = sorted(flow_expectation(seed).required, key=lambda p: (p == "s99", p))
    first = Process(0, 100, "run", False, True, None, 999.0, 1000.0, "running")
    done = {"s00", "pick"}
    first.recorded, first.choices = frozenset(done | {"route#branch"}), {"route#branch": "wide"}
    second = Process(1, 200, "resume", False, False, 0, 1000.0, 1002.0, "completed")
    second.choices = {"route#branch": "wide"}
    executions, records, t = [], {}, 999.5
    for path in steps:
        inflight = path in ("route.wide.fan.a.a1", "route.wide.fan.b.b1")
        for pid in [100] if path in done else [100, 200] if inflight else [200]:
            t += 0.01
            attempt = 2 if pid == 200 and inflight else 1
            executions.append(Execution(path, pid, attempt, t, f"{RUN}:{path}"))
        records[path] = StepRecord(
            step_id=path, status="completed", started_at=t - 0.001, finished_at=t + 0.003
        )
    records["route#branch"] = StepRecord(step_id="route#branch", status="completed", output="wide")
    records["route.wide.fan"] = StepRecord(step_id="route.wide.fan", status="completed")
    return [first, second], executions, records


def _verify(
    seed: str,
    processes: list[Process],
    executions: list[Execution],
    records: dict[str, StepRecord],
    output: object = None,
) -> tuple[list[str], int]:
    out = flow_expectation(seed).outputs[0] if output is None else output
    check = _check(seed)
    report = verify_run(RUN, seed, processes, executions, records, "completed", out, flow=check)
    return report.problems, report.branch_changes


def test_a_correct_history_with_two_steps_in_flight_passes() -> None:
    seed = _seed("wide")
    assert _verify(seed, *_history(seed)) == ([], 0)


def test_verifier_catches_a_branch_changed_on_resume() -> None:
    seed = _seed("wide")
    processes, executions, records = _history(seed)
    processes[1].choices = {"route#branch": "race"}
    problems, changes = _verify(seed, processes, executions, records)
    assert changes == 1
    assert any("route#branch was 'race' after pid 200" in p for p in problems)


def test_verifier_catches_a_recorded_inner_step_run_again() -> None:
    seed = _seed("wide")
    processes, executions, records = _history(seed)
    processes[0].recorded |= {"route.wide.fan.a.a1"}  # recorded before the kill, re-run after
    problems, _ = _verify(seed, processes, executions, records)
    assert any("route.wide.fan.a.a1 ran again in pid 200 after its record" in p for p in problems)


def test_verifier_catches_a_wrong_output_and_a_missing_inner_record() -> None:
    seed = _seed("wide")
    processes, executions, records = _history(seed)
    del records["route.wide.merge"]
    problems, _ = _verify(seed, processes, executions, records, output={"end": 1})
    assert any("wrong output" in p for p in problems)
    assert any("route.wide.merge" in p and "no completed record" in p for p in problems)


def test_verifier_catches_more_steps_in_flight_than_run_at_once() -> None:
    seed = _seed("wide")
    processes, executions, records = _history(seed)
    late = Execution("route.wide.merge", 100, 1, 1000.5, f"{RUN}:route.wide.merge")
    problems, _ = _verify(seed, processes, [*executions, late], records)
    assert any("was killed with" in p for p in problems)


_L2 = "route.race.first.slow.l2"


@pytest.mark.parametrize("status", ["cancelled", "completed"])
def test_only_a_cancelled_record_may_be_of_a_step_that_never_ran(status: str) -> None:
    # A join (or a cancel) may cut a step after its allotment began but before its call: its
    # ``cancelled`` record claims no run. Any other record must come from a run.
    seed = _seed("wide")
    processes, executions, records = _history(seed)
    records[_L2] = StepRecord(step_id=_L2, status=status, started_at=999.9, finished_at=1000.0)
    problems, _ = _verify(seed, processes, executions, records)
    never = [p for p in problems if f"{_L2} has a record but never ran" in p]
    assert len(never) == (status != "cancelled")


def test_verifier_catches_a_cancelled_record_older_than_the_steps_last_run() -> None:
    seed = _seed("wide")
    processes, executions, records = _history(seed)
    executions.append(Execution(_L2, 200, 1, 1001.0, f"{RUN}:{_L2}"))
    cut = StepRecord(step_id=_L2, status="cancelled", started_at=1000.9, finished_at=1001.5)
    records[_L2] = cut  # started after the run (it was cut before its call): fine
    assert not [p for p in _verify(seed, processes, executions, records)[0] if _L2 in p]
    records[_L2] = cut.model_copy(update={"finished_at": 1000.95})  # ended before the run
    problems, _ = _verify(seed, processes, executions, records)
    assert any(f"the record of step {_L2} is not from its last run" in p for p in problems)


@pytest.mark.slow
def test_flow_crash_drill(store_url: str, tmp_path: Path) -> None:
    """Runs of the flow chain killed and resumed on SQLite and Redis: all right, none re-run."""
    seed = random.randrange(1 << 30)
    options = DrillOptions(chain=CHAIN, store_url=store_url, log_dir=tmp_path, flow=True)
    with Drill(options, seed=seed) as drill:
        stats = drill.run_many(6)
    message = f"seed {seed}\n" + "\n".join(stats.lines() + stats.problems[:20])
    assert stats.ok, message
    assert stats.runs_resumed >= 6, message
    assert stats.wrong_outputs == 0, message
    assert stats.reruns_after_record == 0, message
    assert stats.branch_changes == 0, message
    assert stats.kills > stats.kills_before_create, message
