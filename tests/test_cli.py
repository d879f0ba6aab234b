"""The CLI as a person and a script use it: run, crash, resume, runs, inspect, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHAINS = Path(__file__).parent / "data" / "chains"


def chainrt(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chainrt", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "CHAINRT_STORE": f"sqlite:///{tmp_path / 'cli.db'}",
        "CHAINRT_TEST_LOG": str(tmp_path / "calls.jsonl"),
    }


def calls(env: dict[str, str]) -> list[str]:
    path = Path(env["CHAINRT_TEST_LOG"])
    return (
        [json.loads(line)["tool"] for line in path.read_text().splitlines()]
        if path.exists()
        else []
    )


def test_crash_in_third_tool_then_resume_finishes_without_rerunning(
    env: dict[str, str], tmp_path: Path
) -> None:
    marker = tmp_path / "crashed"
    crashed = chainrt(
        "run",
        str(CHAINS / "crashy.yaml"),
        "--input",
        json.dumps({"marker": str(marker)}),
        "--run-id",
        "crash-1",
        "--json",
        env=env,
    )
    assert crashed.returncode == 17, crashed.stderr  # the tool's os._exit took the process down
    assert calls(env) == ["one", "two", "three"]

    inspect = chainrt("inspect", "crash-1", "--json", env=env)
    assert inspect.returncode == 0, inspect.stderr
    before = json.loads(inspect.stdout)
    assert before["status"] == "running"
    assert [s["id"] for s in before["steps"]] == ["one", "two"]
    used_before = before["budget"]["used_ms"]
    assert used_before >= 200  # step one slept 0.2 s

    # The chain's folder is not under this working directory's chains/: name it a chain root.
    refused = chainrt("resume", "crash-1", "--json", env=env)
    assert refused.returncode == 3
    assert "outside this runner's chain roots" in refused.stderr
    resumed = chainrt("resume", "crash-1", "--json", "--chains", str(CHAINS), env=env)
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert result["status"] == "completed"
    assert result["output"] == {"sum": 2, "three": {"name": "three", "survived": True}}
    assert calls(env) == ["one", "two", "three", "three"]  # one and two were not called again
    assert (
        result["budget"]["used_ms"] >= used_before
    )  # the budget used before the crash carried over
    assert [s["id"] for s in result["steps"]] == ["one", "two", "three", "four"]
    for step in result["steps"]:
        assert set(step) >= {
            "id",
            "status",
            "attempts",
            "allotted_ms",
            "elapsed_ms",
            "model",
            "fallback",
        }


def test_human_output_shows_progress_and_summary(env: dict[str, str]) -> None:
    done = chainrt("run", str(CHAINS / "misc.yaml"), "--input", '{"x": 1}', env=env)
    assert done.returncode == 0, done.stderr
    assert "COMPLETED" in done.stdout
    for step in ("ctx", "flaky", "sum"):
        assert step in done.stderr  # live per-step lines
    assert "allotted" in done.stderr
    listed = chainrt("runs", env=env)
    assert "misc" in listed.stdout
    assert "completed" in listed.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "nope.yaml", "--input", "{}"], "nope.yaml"),
        (["run", str(CHAINS / "misc.yaml"), "--input", "{not json"], "not valid JSON"),
        (["run", str(CHAINS / "misc.yaml"), "--input", '{"x": "a"}'], "must be int"),
        (["run", str(CHAINS / "misc.yaml"), "--input", '{"x": 1}', "--budget", "soon"], "--budget"),
        (["resume", "no-such-run"], "no-such-run"),
        (["inspect", "no-such-run"], "no-such-run"),
        (["frobnicate"], "invalid choice"),
        (
            ["run", str(CHAINS / "misc.yaml"), "--input", '{"x": 1}', "--store", "ftp://x"],
            "ftp://x",
        ),
    ],
)
def test_errors_are_one_line_without_traceback(
    env: dict[str, str], args: list[str], message: str
) -> None:
    done = chainrt(*args, env=env)
    assert done.returncode not in (0, 1) or args[0] in ("resume", "inspect")
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert message in lines[0]
    assert "Traceback" not in done.stderr


def test_validate_and_schema(env: dict[str, str], tmp_path: Path) -> None:
    ok = chainrt("validate", str(CHAINS), env=env)
    assert ok.returncode == 0, ok.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nbudget: 1s\nsteps:\n  - id: a\n    tool: t.py:f\n    colour: red\n")
    failed = chainrt("validate", str(bad), env=env)
    assert failed.returncode == 2
    assert f"{bad}:6" in failed.stderr
    assert "colour" in failed.stderr
    schema = chainrt("schema", env=env)
    assert json.loads(schema.stdout)["properties"]["steps"]
