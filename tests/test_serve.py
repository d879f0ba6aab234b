"""``chainrt serve`` as real processes over HTTP: submit semantics, events, cancel, priority."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).parent / "data" / "serve"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def call_log(tmp_path: Path) -> Path:
    return tmp_path / "calls.jsonl"


def calls(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def sqlite_runner(tmp_path: Path, call_log: Path) -> Iterator[ServeProcess]:
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    with ServeProcess(
        store=store, chains=CHAINS, max_runs=2, env={"CHAINRT_TEST_LOG": str(call_log)}
    ) as runner:
        yield runner


def test_submit_wait_idempotency_and_errors(sqlite_runner: ServeProcess) -> None:
    r = sqlite_runner
    body = {"chain": "ten", "input": {"seconds": 0.0}, "run_id": "idem-1"}
    first = r.post("/v1/runs", json=body)
    assert (first.status_code, first.json()) == (202, {"run_id": "idem-1", "status": "queued"})
    final = r.get("/v1/runs/idem-1", params={"wait": "30s"}).json()
    assert (final["status"], final["output"]) == ("completed", 45)
    assert [s["id"] for s in final["steps"]] == [f"s{i}" for i in range(10)]
    again = r.post("/v1/runs", json=body)  # same id, same body: that run
    assert (again.status_code, again.json()["status"]) == (200, "completed")
    other = r.post("/v1/runs", json={**body, "input": {"seconds": 1.0}})
    assert other.status_code == 409
    assert other.json()["error"]["field"] == "run_id"

    missing = r.post("/v1/runs", json={"chain": "ten"})
    assert missing.status_code == 422
    assert missing.json()["error"] == {
        "type": "invalid_request",
        "message": "input: Field required",
        "field": "input",
    }
    typo = r.post("/v1/runs", json={**body, "run_id": None, "priorty": "high"})
    assert (typo.status_code, typo.json()["error"]["field"]) == (422, "priorty")
    bad_input = r.post("/v1/runs", json={"chain": "ten", "input": {"seconds": "x"}})
    assert bad_input.status_code == 422
    assert "'seconds'" in bad_input.json()["error"]["message"]
    not_json = r.post("/v1/runs", content=b"{oops", headers={"content-type": "application/json"})
    assert not_json.status_code == 422
    assert "not valid JSON" in not_json.json()["error"]["message"]
    unknown = r.post("/v1/runs", json={"chain": "nope", "input": {}})
    assert unknown.status_code == 404
    assert "known: five, nap, ten" in unknown.json()["error"]["message"]
    assert r.get("/v1/runs/no-such-run").status_code == 404

    spec = r.get("/openapi.json").json()
    assert "/v1/runs" in spec["paths"]
    assert "SubmitRequest" in spec["components"]["schemas"]
    assert [c["name"] for c in r.get("/v1/chains").json()] == ["five", "nap", "ten"]
    listed = r.get("/v1/runs", params={"chain": "ten"}).json()
    assert [run["run_id"] for run in listed] == ["idem-1"]


def test_wait_returns_when_the_run_is_final_not_before(sqlite_runner: ServeProcess) -> None:
    r = sqlite_runner
    r.post("/v1/runs", json={"chain": "ten", "input": {"seconds": 0.05}, "run_id": "w1"})
    early = r.get("/v1/runs/w1", params={"wait": "10ms"}).json()
    assert early["status"] in ("queued", "running")  # ten steps of 50 ms are not done in 10 ms
    final = r.get("/v1/runs/w1", params={"wait": "60s"}).json()
    assert (final["status"], final["output"]) == ("completed", 45)


def test_events_stream_history_then_live_until_run_finished(sqlite_runner: ServeProcess) -> None:
    r = sqlite_runner
    r.post("/v1/runs", json={"chain": "ten", "input": {"seconds": 0.05}, "run_id": "ev1"})
    kinds: list[str] = []
    steps: list[str] = []
    with httpx.stream("GET", f"{r.url}/v1/runs/ev1/events", timeout=60) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        for line in stream.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                assert event["run_id"] == "ev1"
                kinds.append(event["type"])
                if event["type"] == "step_finished":
                    steps.append(event["step_id"])
    assert kinds[0] == "run_started"
    assert kinds[-1] == "run_finished"  # and the stream ended by itself after it
    assert steps == [f"s{i}" for i in range(10)]  # each step once, history and live joined


def test_cancel_a_queued_run_never_starts_and_a_running_one_stops(
    sqlite_runner: ServeProcess, call_log: Path
) -> None:
    r = sqlite_runner  # max_runs 2: two long naps take both slots
    for name in ("busy-1", "busy-2", "waiting"):
        body = {"chain": "nap", "input": {"seconds": 30.0, "label": name}, "run_id": name}
        assert r.post("/v1/runs", json=body).status_code == 202
    while len(calls(call_log)) < 2:
        time.sleep(0.02)
    cancelled = r.post("/v1/runs/waiting/cancel")
    assert (cancelled.status_code, cancelled.json()["status"]) == (202, "cancelled")
    started = time.monotonic()
    assert r.post("/v1/runs/busy-1/cancel").json()["status"] == "cancelled"
    final = r.get("/v1/runs/busy-1", params={"wait": "10s"}).json()
    took = time.monotonic() - started
    assert final["status"] == "cancelled"
    # A 30 s nap: under 5 s can only mean it was cut (goal 1 s; the margin is for a loaded box).
    assert took < 5.0
    r.post("/v1/runs/busy-2/cancel")
    time.sleep(1.5)  # a slot is free now: the cancelled queued run must still not start
    assert sorted(str(c["run"]) for c in calls(call_log)) == ["busy-1", "busy-2"]
    assert r.get("/v1/runs/waiting").json()["status"] == "cancelled"
    assert r.get("/v1/runs/waiting").json()["steps"] == []


def test_health_and_metrics(sqlite_runner: ServeProcess) -> None:
    r = sqlite_runner
    assert r.get("/health/live").json() == {"status": "live"}
    assert r.get("/health/ready").json()["status"] == "ready"
    r.post("/v1/runs", json={"chain": "five", "input": {}, "run_id": "m1"})
    assert r.get("/v1/runs/m1", params={"wait": "30s"}).json()["status"] == "completed"
    text = r.get("/metrics").text
    assert 'chainrt_runs_total{status="completed"} 1.0' in text
    assert 'chainrt_queue_depth{priority="critical"} 0.0' in text
    assert "chainrt_step_seconds_count 5.0" in text


def test_cli_submit_wait_and_cancel(sqlite_runner: ServeProcess, call_log: Path) -> None:
    r = sqlite_runner
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "chainrt",
            "submit",
            "ten",
            "--input",
            '{"seconds": 0}',
            "--server",
            r.url,
            "--wait",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (json.loads(done.stdout)["status"], json.loads(done.stdout)["output"]) == (
        "completed",
        45,
    )
    r.post(
        "/v1/runs",
        json={"chain": "nap", "input": {"seconds": 30.0, "label": "c"}, "run_id": "cli-c"},
    )
    while not any(c["run"] == "cli-c" for c in calls(call_log)):
        time.sleep(0.02)
    cancel = subprocess.run(
        [sys.executable, "-m", "chainrt", "cancel", "cli-c", "--store", r.store, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert cancel.returncode == 0, cancel.stderr
    assert json.loads(cancel.stdout) == {
        "run_id": "cli-c",
        "status": "cancelled",
        "cancelled": True,
    }
    # The runner (another process, SQLite: no pub/sub) notices within its look-up interval.
    final = r.get("/v1/runs/cli-c", params={"wait": "10s"}).json()
    assert final["status"] == "cancelled"
    bad = subprocess.run(
        [sys.executable, "-m", "chainrt", "submit", "nope", "--input", "{}", "--server", r.url],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2
    assert "no chain named 'nope'" in bad.stderr


def test_a_bad_wait_is_a_422_naming_it_and_the_api_document_lists_it(
    sqlite_runner: ServeProcess,
) -> None:
    r = sqlite_runner
    r.post("/v1/runs", json={"chain": "five", "input": {}, "run_id": "bad-wait"})
    for wait in ("soon", "-1s", ""):
        answer = r.get("/v1/runs/bad-wait", params={"wait": wait})
        assert answer.status_code == 422, (wait, answer.text)
        assert answer.json()["error"]["field"] == "query.wait"
    assert r.get("/v1/runs/bad-wait", params={"wait": "0s"}).json()["run_id"] == "bad-wait"
    operation = r.get("/openapi.json").json()["paths"]["/v1/runs/{run_id}"]["get"]
    assert {(p["name"], p["in"]) for p in operation["parameters"]} == {
        ("run_id", "path"),
        ("wait", "query"),
    }
