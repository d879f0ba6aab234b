"""``chainrt run`` of a chain that waits (exit 4 and the command that continues it), ``chainrt
signal`` (continues it; a bad payload exits 2 and leaves it waiting), ``chainrt runs --status``."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from chainrt.cli import main

CHAIN = """
name: approval
budget: 10s
inputs: {amount: int}
steps:
  - id: approve
    wait:
      signal: manager_ok
      schema: {approved: bool, "note?": str}
  - id: act
    tool: tools.py:act
    args: {amount: "{{ input.amount }}", decision: "{{ steps.approve.output }}"}
"""

TOOLS = """
def act(amount: int, decision: dict) -> dict:
    return {"refunded": amount if decision["approved"] else 0}
"""


@pytest.fixture
def chain(tmp_path: Path) -> Path:
    folder = tmp_path / "chains"
    folder.mkdir()
    (folder / "tools.py").write_text(TOOLS)
    path = folder / "approval.yaml"
    path.write_text(CHAIN)
    return path


def test_run_exits_4_and_prints_the_signal_that_continues_it(
    chain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    code = main(
        ["run", str(chain), "--input", '{"amount": 30}', "--run-id", "c1", "--store", store]
    )
    out, err = capsys.readouterr()
    assert code == 4
    assert "WAITING" in out
    line = next(x for x in err.splitlines() if "continue it with:" in x)
    command = shlex.split(line.split("continue it with: ", 1)[1])
    assert command[:4] == ["chainrt", "signal", "c1", "manager_ok"]
    assert json.loads(command[command.index("--payload") + 1]) == {"approved": True, "note": "..."}
    assert command[command.index("--store") + 1] == store

    assert main(["runs", "--status", "waiting", "--json", "--store", store]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(r["run_id"], r["status"]) for r in listed] == [("c1", "waiting")]

    bad = main(["signal", "c1", "manager_ok", "--payload", '{"approved": "yes"}', "--store", store])
    err = capsys.readouterr().err
    assert bad == 2
    assert "does not match the wait's schema" in err
    assert "keeps waiting" in err

    code = main(
        [
            "signal",
            "c1",
            "manager_ok",
            "--payload",
            '{"approved": true}',
            "--store",
            store,
            "--chains",
            str(chain.parent),
            "--json",
        ]
    )
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert (result["status"], result["output"]) == ("completed", {"refunded": 30})


def test_run_json_reports_waiting(
    chain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    code = main(
        [
            "run",
            str(chain),
            "--input",
            '{"amount": 5}',
            "--run-id",
            "c2",
            "--store",
            store,
            "--json",
        ]
    )
    out, _ = capsys.readouterr()
    assert code == 4
    payload = json.loads(out)
    assert (payload["status"], payload["stopped_at"]) == ("waiting", "approve")
    assert [s["status"] for s in payload["steps"]] == ["waiting"]
    kept = main(
        [
            "signal",
            "c2",
            "manager_ok",
            "--payload",
            '{"approved": false}',
            "--store",
            store,
            "--no-resume",
            "--json",
        ]
    )
    assert kept == 4  # kept only: the run is still waiting until something resumes it
    assert json.loads(capsys.readouterr().out)["status"] == "waiting"
    assert main(["resume", "c2", "--store", store, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["output"] == {"refunded": 0}
