"""Waiting runs under ``chainrt serve`` (real servers): a parked run holds no runner slot, a
signal over HTTP (scope ``operate``) queues it for any runner, a bad payload leaves it waiting,
a runner killed with ``kill -9`` and a restart lose nothing, a timeout moves it on its own."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from chainrt._api_tokens import hash_token, required_scope
from chainrt.testing.serve_process import ServeProcess

pytestmark = [pytest.mark.slow]

TOOLS = """
def act(amount: int, decision: object) -> dict:
    approved = isinstance(decision, dict) and decision.get("approved") is True
    return {"refunded": amount if approved else 0}
"""

CHAIN = """
name: approval
budget: 30s
inputs: {amount: int}
steps:
  - id: approve
    wait:
      signal: manager_ok
      schema: {approved: bool}
%s
  - id: act
    tool: waittools.py:act
    args: {amount: "{{ input.amount }}", decision: "{{ steps.approve.output }}"}
"""


def _chains(tmp_path: Path, extra: str = "") -> Path:
    chains = tmp_path / "chains"
    chains.mkdir(exist_ok=True)
    (chains / "waittools.py").write_text(TOOLS)
    (chains / "approval.yaml").write_text(CHAIN % extra)
    return chains


def _until(server: ServeProcess, run_id: str, status: str, within_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    while True:
        run: dict[str, Any] = server.get(f"/v1/runs/{run_id}").json()
        if run.get("status") == status:
            return run
        assert time.monotonic() < deadline, (run, server.log())
        time.sleep(0.05)


def test_the_signal_route_needs_scope_operate() -> None:
    assert required_scope("POST", "/v1/runs/r1/signal") == "operate"


def test_parked_runs_hold_no_slot_and_continue_on_another_runner(
    tmp_path: Path, redis_url: str
) -> None:
    chains = _chains(tmp_path)
    # One slot each: if a parked run held its slot, the second and third could never start.
    with ServeProcess(store=redis_url, chains=chains, max_runs=1) as first:
        for n in range(3):
            body = {"chain": "approval", "input": {"amount": 10 + n}, "run_id": f"sw{n}"}
            assert first.post("/v1/runs", json=body).status_code == 202
        for n in range(3):
            _until(first, f"sw{n}", "waiting")
        listed = first.get("/v1/runs?status=waiting").json()
        assert sorted(r["run_id"] for r in listed) == ["sw0", "sw1", "sw2"]
        bad = first.post("/v1/runs/sw0/signal", json={"name": "manager_ok", "payload": {"x": 1}})
        assert bad.status_code == 422
        assert bad.json()["error"]["type"] == "signal_refused"
        assert "keeps waiting" in bad.json()["error"]["message"]
        unknown = first.post("/v1/runs/sw0/signal", json={"name": "nope", "payload": {}})
        assert unknown.status_code == 409
        assert first.post("/v1/runs/ghost/signal", json={"name": "x"}).status_code == 404
        assert first.get("/v1/runs/sw0").json()["status"] == "waiting"
        assert 'chainrt_runs_total{status="waiting"} 3.0' in first.get("/metrics").text
        first.kill()  # kill -9: the waiting runs lose nothing, they are records only
    with ServeProcess(store=redis_url, chains=chains, max_runs=1) as second:
        ok = second.post(
            "/v1/runs/sw0/signal", json={"name": "manager_ok", "payload": {"approved": True}}
        )
        assert ok.status_code == 202
        assert ok.json() == {
            "run_id": "sw0",
            "status": "waiting",
            "signal": "manager_ok",
            "stored": True,
            "queued": True,
        }
        done = _until(second, "sw0", "completed")
        assert done["output"] == {"refunded": 10}
        refused = second.post(
            "/v1/runs/sw1/signal", json={"name": "manager_ok", "payload": {"approved": False}}
        )
        assert refused.status_code == 202
        assert _until(second, "sw1", "completed")["output"] == {"refunded": 0}
        assert second.get("/v1/runs/sw2").json()["status"] == "waiting"


def test_a_wait_times_out_under_serve_without_a_request(tmp_path: Path) -> None:
    chains = _chains(tmp_path, "      timeout: 1s\n      on_timeout: continue")
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    with ServeProcess(store=store, chains=chains) as server:
        body = {"chain": "approval", "input": {"amount": 7}, "run_id": "st"}
        assert server.post("/v1/runs", json=body).status_code == 202
        _until(server, "st", "waiting")
        done = _until(server, "st", "completed")
        assert done["output"] == {"refunded": 0}
        # A signal sent at once, while the run is queued or running, is kept for its wait.
        body = {"chain": "approval", "input": {"amount": 8}, "run_id": "early"}
        assert server.post("/v1/runs", json=body).status_code == 202
        signal = {"name": "manager_ok", "payload": {"approved": True}}
        early = server.post("/v1/runs/early/signal", json=signal)
        assert early.status_code == 202
        assert early.json()["stored"]
        assert _until(server, "early", "completed")["output"] == {"refunded": 8}


def test_a_signal_needs_an_operate_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from chainrt.cli import main

    tokens = tmp_path / "tokens"
    tokens.write_text(
        f"viewer:read,submit:{hash_token('r' * 32)}\nops:operate:{hash_token('o' * 32)}\n"
    )
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    with ServeProcess(store=store, chains=_chains(tmp_path), args=["--tokens", str(tokens)]) as s:
        viewer = {"Authorization": "Bearer " + "r" * 32}
        body = {"chain": "approval", "input": {"amount": 3}, "run_id": "tok"}
        assert s.post("/v1/runs", json=body, headers=viewer).status_code == 202
        _until_with(s, "tok", "waiting", viewer)
        signal = {"name": "manager_ok", "payload": {"approved": True}}
        assert s.post("/v1/runs/tok/signal", json=signal, headers=viewer).status_code == 403
        assert s.post("/v1/runs/tok/signal", json=signal).status_code == 401
        # chainrt signal --server: through the API, with the token.
        cli = ["signal", "tok", "manager_ok", "--server", s.url, "--json"]
        assert main([*cli, "--payload", '{"approved": 1}', "--token", "o" * 32]) == 2
        assert "does not match the wait's schema" in capsys.readouterr().err
        assert main([*cli, "--payload", '{"approved": true}', "--token", "r" * 32]) == 3
        capsys.readouterr()
        assert main([*cli, "--payload", '{"approved": true}', "--token", "o" * 32]) == 0
        assert json.loads(capsys.readouterr().out)["queued"] is True
        assert _until_with(s, "tok", "completed", viewer)["output"] == {"refunded": 3}


def _until_with(
    server: ServeProcess, run_id: str, status: str, headers: dict[str, str]
) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        run: dict[str, Any] = server.get(f"/v1/runs/{run_id}", headers=headers).json()
        if run.get("status") == status:
            return run
        assert time.monotonic() < deadline, (run, server.log())
        time.sleep(0.05)


def test_waiting_ends_a_get_wait_a_submit_wait_and_an_event_stream(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from chainrt.cli import main

    store = f"sqlite:///{tmp_path / 'runs.db'}"
    with ServeProcess(store=store, chains=_chains(tmp_path)) as server:
        code = main(
            [
                "submit",
                "approval",
                "--input",
                '{"amount": 4}',
                "--server",
                server.url,
                "--wait",
                "--json",
            ]
        )
        payload = json.loads(capsys.readouterr().out)
        assert (code, payload["status"]) == (4, "waiting")
        run_id = payload["run_id"]
        started = time.monotonic()
        answer = server.get(f"/v1/runs/{run_id}", params={"wait": "30s"})
        answered_in = time.monotonic() - started
        assert answer.json()["status"] == "waiting"
        assert answered_in < 20  # a parked run is at rest: ?wait= does not sit out its 30 s
        events = server.get(f"/v1/runs/{run_id}/events").text
        last = [line for line in events.splitlines() if line.startswith("data:")][-1]
        final = json.loads(last.removeprefix("data:"))
        assert (final["type"], final["status"]) == ("run_finished", "waiting")
