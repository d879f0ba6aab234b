"""``ctx.attempt`` counts on across retries, crashes and resumes: a re-run is never attempt 1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import chainrt
from chainrt._events import history
from chainrt._run._tool import attempts_before
from chainrt.store import AttemptRecord, RunRecord, StepRecord

CHAIN = """\
name: attempts
budget: {budget}
inputs: {{log: str}}
steps:
  - id: act
    tool: tools.py:{tool}
    args: {{log: "{{{{ input.log }}}}"}}
    retry: {{attempts: 2, backoff: 10ms}}
"""

TOOLS = """\
import json
import os
import time


def _note(log, ctx):
    with open(log, "a") as fh:
        fh.write(json.dumps({"attempt": ctx.attempt, "pid": os.getpid()}) + "\\n")


def hang_first(log, ctx):
    _note(log, ctx)
    if ctx.attempt == 1:
        time.sleep(60)  # killed here
    return {"attempt": ctx.attempt}


def fail_twice(log, ctx):
    _note(log, ctx)
    if ctx.attempt <= 2:
        raise RuntimeError(f"attempt {ctx.attempt} fails")
    return {"attempt": ctx.attempt}


def plain(log):
    return {"ok": True}
"""


def _files(tmp_path: Path, tool: str, budget: str = "20s") -> Path:
    (tmp_path / "tools.py").write_text(TOOLS)
    chain = tmp_path / "chain.yaml"
    chain.write_text(CHAIN.format(tool=tool, budget=budget))
    return chain


def _attempts(log: Path) -> list[int]:
    if not log.exists():
        return []
    return [json.loads(line)["attempt"] for line in log.read_text().splitlines()]


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (None, 0),
        (StepRecord(step_id="a", status="running", attempts=1), 1),
        (StepRecord(step_id="a", status="failed", attempts=2), 2),
        (
            StepRecord(
                step_id="a",
                status="failed",
                attempts=1,
                attempt_log=[AttemptRecord(attempt=3, status="error", elapsed_ms=1.0)],
            ),
            3,
        ),
    ],
)
def test_attempts_before(record: StepRecord | None, expected: int) -> None:
    assert attempts_before(record) == expected


def test_a_running_record_is_an_unfinished_step_to_a_late_watcher() -> None:
    run = RunRecord(run_id="r1", chain="c", spec={}, input={}, budget_total_ms=1000.0)
    earlier = AttemptRecord(attempt=1, status="error", elapsed_ms=3.0, detail="boom")
    steps = {
        "a": StepRecord(step_id="a", status="completed", started_at=1.0, finished_at=2.0),
        "b": StepRecord(step_id="b", status="running", attempts=2, started_at=3.0,
                        attempt_log=[earlier]),
    }  # fmt: skip
    kinds = [(e.type, e.step_id) for e in history(run, steps)]
    assert kinds == [
        ("run_started", None),
        ("step_started", "a"),
        ("step_finished", "a"),
        ("step_started", "b"),
        ("attempt", "b"),  # its earlier attempt; the one in flight has not ended
    ]


def test_a_resumed_step_counts_on_from_the_failed_attempts(tmp_path: Path) -> None:
    chain = chainrt.load(_files(tmp_path, "fail_twice"))
    store = f"sqlite:///{tmp_path}/runs.db"
    log = tmp_path / "calls.jsonl"
    first = chain.run({"log": str(log)}, store=store, run_id="r1")
    assert first.status == "failed"
    assert _attempts(log) == [1, 2]
    again = chainrt.resume("r1", store=store)
    assert again.status == "completed", again.error
    assert again.output == {"attempt": 3}
    assert _attempts(log) == [1, 2, 3]
    assert again.steps[0].attempts == 1  # this execution's calls; the numbers go on


def test_a_tool_without_ctx_writes_no_running_record(tmp_path: Path) -> None:
    chain = chainrt.load(_files(tmp_path, "plain"))
    store = f"sqlite:///{tmp_path}/runs.db"
    result = chain.run({"log": "-"}, store=store, run_id="r1")
    assert result.status == "completed"
    assert result.steps[0].attempts == 1


@pytest.mark.slow
def test_a_rerun_after_a_kill_sees_attempt_2(tmp_path: Path) -> None:
    _files(tmp_path, "hang_first", budget="2m")
    store = f"sqlite:///{tmp_path}/runs.db"
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "CHAINRT_CHAIN_ROOTS": str(tmp_path)}
    args = [sys.executable, "-m", "chainrt"]
    run = subprocess.Popen(
        [*args, "run", "chain.yaml", "--input", json.dumps({"log": str(log)}),
         "--store", store, "--run-id", "r1", "--json"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not _attempts(log) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _attempts(log) == [1], "the tool never started"
        run.send_signal(signal.SIGKILL)  # a crash in the middle of attempt 1
    finally:
        run.kill()
        run.wait(30)
        assert run.stderr is not None
        run.stderr.close()
    resumed = subprocess.run(
        [*args, "resume", "r1", "--store", store, "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert result["status"] == "completed"
    assert result["output"] == {"attempt": 2}
    assert _attempts(log) == [1, 2]
