"""``queued`` and ``cancelled`` runs of a real ``chainrt serve``, as ``chainrt runs`` and
``chainrt inspect`` show them (text and ``--json``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).parent / "data" / "serve"
REPO = Path(__file__).resolve().parent.parent


def cli(store: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "chainrt", *args, "--store", store],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def listed(store: str, *args: str) -> dict[str, str]:
    rows: list[dict[str, Any]] = json.loads(cli(store, "runs", "--json", *args))
    return {str(row["run_id"]): str(row["status"]) for row in rows}


def table(text: str) -> dict[str, str]:
    """Run id -> status from the text table of ``chainrt runs``."""
    lines = text.strip().splitlines()
    assert lines[0].split()[:3] == ["RUN", "ID", "CHAIN"]
    return {line.split()[0]: line.split()[2] for line in lines[1:]}


def test_runs_and_inspect_show_queued_and_cancelled(tmp_path: Path) -> None:
    call_log = tmp_path / "calls.jsonl"
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    env = {"CHAINRT_TEST_LOG": str(call_log)}
    with ServeProcess(store=store, chains=CHAINS, max_runs=1, env=env) as r:
        for name in ("hold", "waiting", "dropped"):  # one slot: "hold" runs, two wait
            body = {"chain": "nap", "input": {"seconds": 30.0, "label": name}, "run_id": name}
            assert r.post("/v1/runs", json=body).status_code == 202
        deadline = time.monotonic() + 60
        while not call_log.exists():  # "hold" is in its step
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert r.post("/v1/runs/dropped/cancel").json()["status"] == "cancelled"

        expected = {"hold": "running", "waiting": "queued", "dropped": "cancelled"}
        assert table(cli(store, "runs")) == expected
        assert listed(store) == expected
        assert table(cli(store, "runs", "--status", "queued")) == {"waiting": "queued"}
        assert listed(store, "--status", "queued") == {"waiting": "queued"}
        assert listed(store, "--status", "cancelled") == {"dropped": "cancelled"}

        text = cli(store, "inspect", "waiting")
        assert "status   queued" in text.splitlines()
        queued = json.loads(cli(store, "inspect", "waiting", "--json"))
        assert (queued["status"], queued["steps"], queued["error"]) == ("queued", [], None)

        text = cli(store, "inspect", "dropped")
        assert "status   cancelled" in text.splitlines()
        assert "error    cancelled by request" in text.splitlines()
        dropped = json.loads(cli(store, "inspect", "dropped", "--json"))
        assert (dropped["status"], dropped["steps"]) == ("cancelled", [])

        # A run cancelled in its step is listed and inspected as cancelled too.
        assert r.post("/v1/runs/hold/cancel").json()["status"] == "cancelled"
        assert r.get("/v1/runs/hold", params={"wait": "10s"}).json()["status"] == "cancelled"
        assert listed(store, "--status", "cancelled") == {
            "hold": "cancelled",
            "dropped": "cancelled",
        }
        assert json.loads(cli(store, "inspect", "hold", "--json"))["status"] == "cancelled"
        # Its step in flight is where it stopped, recorded cancelled (issue 41).
        assert "status   cancelled  stopped at nap" in cli(store, "inspect", "hold").splitlines()
    ran = [json.loads(line)["run"] for line in call_log.read_text().splitlines()]
    assert ran[0] == "hold"
    assert "dropped" not in ran  # cancelled while queued: it never started
