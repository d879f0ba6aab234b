"""What a run prints: the whole output, a degraded run said to be degraded, --version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import chainrt
from chainrt._records import RunRecord, StepRecord
from chainrt._result import RunResult
from chainrt.testing.redis_server import free_port

LONG = "".join(f"word{i} " for i in range(200)) + "THE END"  # ~1,300 characters

TOOLS = f"""
def long_text() -> str:
    return {LONG!r}
"""

CHAIN = """
name: degraded
budget: 10s
steps:
  - id: intent
    llm: {model: primary, prompt: "What does the user want?"}
    static_answer: "unknown"
    retry: {attempts: 1}
  - id: answer
    llm: {model: primary, prompt: "Answer: {{ steps.intent.output }}"}
    static_answer: "Sorry, try again later."
  - id: text
    tool: tools.py:long_text
output:
  answer: "{{ steps.answer.output }}"
  text: "{{ steps.text.output }}"
"""


def chainrt_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chainrt", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    (tmp_path / "tools.py").write_text(TOOLS)
    (tmp_path / "chain.yaml").write_text(CHAIN)
    # Nothing listens on this port: every attempt at `primary` is a real connection refusal.
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        f"models:\n  primary:\n    endpoints:\n      - url: http://127.0.0.1:{free_port()}\n"
    )
    env = {
        **os.environ,
        "CHAINRT_STORE": f"sqlite:///{tmp_path / 'runs.db'}",
        "CHAINRT_POOL": str(pool),
    }
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    env.pop("OTEL_TRACES_EXPORTER", None)
    return tmp_path, env


def test_a_run_answered_by_static_answers_says_degraded(setup: tuple[Path, dict[str, str]]) -> None:
    folder, env = setup
    done = chainrt_cli("run", str(folder / "chain.yaml"), "--input", "{}", "--json", env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "completed"
    assert result["degraded"] is True
    assert result["llm_answers"] == {
        "steps": 2,
        "primary": 0,
        "fallback": 0,
        "static": 2,
        "unanswered": 0,
    }
    assert result["output"]["answer"] == "Sorry, try again later."
    assert result["output"]["text"] == LONG  # --json never cut anything

    human = chainrt_cli("run", str(folder / "chain.yaml"), "--input", "{}", env=env)
    assert human.returncode == 0, human.stderr
    summary = human.stdout.splitlines()[0]
    assert summary.startswith("COMPLETED (DEGRADED)"), human.stdout
    assert "degraded: 2 of 2 LLM steps answered by their static answer" in human.stdout
    output_line = next(line for line in human.stdout.splitlines() if line.startswith("output:"))
    assert output_line.endswith('THE END"}'), output_line  # the whole answer, not 300 chars


def test_inspect_shows_the_whole_output_and_cuts_step_outputs_unless_full(
    setup: tuple[Path, dict[str, str]],
) -> None:
    folder, env = setup
    run = chainrt_cli(
        "run", str(folder / "chain.yaml"), "--input", "{}", "--run-id", "r-full", env=env
    )
    assert run.returncode == 0, run.stderr
    shown = chainrt_cli("inspect", "r-full", env=env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    run_output = next(line for line in lines if line.startswith("output "))
    assert run_output.endswith('THE END"}')
    step_output = [line for line in lines if line.strip().startswith("output:")][-1]
    assert "THE END" not in step_output
    assert f"{len(LONG) - 200} more characters; --full shows all" in step_output
    assert "degraded: 2 of 2" in shown.stdout

    full = chainrt_cli("inspect", "r-full", "--full", env=env)
    assert full.returncode == 0, full.stderr
    step_output = [line for line in full.stdout.splitlines() if "output:" in line][-1]
    assert step_output.strip() == f"output: {LONG}"


def test_a_run_answered_by_models_is_not_degraded() -> None:
    spec = {
        "steps": [
            {"id": "a", "llm": {"model": "primary"}},
            {"id": "b", "llm": {"model": "primary"}},
            {"id": "c", "llm": {"model": "primary"}},
            {"id": "d", "llm": {"model": "primary"}},
            {"id": "t", "tool": "tools.py:f", "llm": None},
        ]
    }
    run = RunRecord(
        run_id="r", chain="c", spec=spec, input={}, status="completed", budget_total_ms=1000
    )
    steps = {
        "a": StepRecord(step_id="a", status="completed", model="primary"),
        "b": StepRecord(step_id="b", status="completed", model="local", fallback="local"),
        "c": StepRecord(step_id="c", status="failed", model="primary"),
        "t": StepRecord(step_id="t", status="completed"),
    }
    result = RunResult.from_records(run, steps)
    assert result.degraded is False
    assert result.llm_answers.model_dump() == {
        "steps": 3,  # d never ran; t is a tool
        "primary": 1,
        "fallback": 1,
        "static": 0,
        "unanswered": 1,
    }
    steps["d"] = StepRecord(step_id="d", status="completed", model="static", fallback="static")
    result = RunResult.from_records(run, steps)
    assert result.degraded is True
    assert result.llm_answers.static == 1


def test_version(tmp_path: Path) -> None:
    done = chainrt_cli("--version", env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"chainrt {chainrt.__version__}"


def test_a_bad_setting_is_one_line_naming_the_variable(tmp_path: Path) -> None:
    env = {**os.environ, "CHAINRT_LEASE_TTL_S": "-1", "CHAINRT_LOCAL_THREADS": "many"}
    env["CHAINRT_STORE"] = f"sqlite:///{tmp_path / 'runs.db'}"
    (tmp_path / "c.yaml").write_text("name: c\nbudget: 1s\nsteps:\n  - id: a\n    tool: t.py:f\n")
    (tmp_path / "t.py").write_text("def f() -> int:\n    return 1\n")
    done = chainrt_cli("run", str(tmp_path / "c.yaml"), "--input", "{}", env=env)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("chainrt: bad setting CHAINRT_LEASE_TTL_S='-1': ")
    assert "CHAINRT_LOCAL_THREADS='many'" in lines[0]
