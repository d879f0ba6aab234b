"""Runs reach a runner that can run them, and what cannot be run says so (real ``chainrt serve``
processes on a real Redis): runners with different chains share one Redis, a run no live runner
serves is visible as such, ``submit --wait`` gives up and says why, a run refused as untrusted is
``failed`` with its reason, a Redis error between record and entry is a 503 JSON and no orphan,
and the start-up is logged (duplicate chain names refused)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from chainrt._records import RunRecord
from chainrt.cli import EXIT_RUNTIME
from chainrt.serve._queue import stream_key
from chainrt.spec import load_spec
from chainrt.spec._dump import spec_dump
from chainrt.store import open_store
from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).parent / "data" / "serve"

pytestmark = pytest.mark.redis


def only_b(tmp_path: Path) -> Path:
    """A chains folder with one chain that the shared test folder does not have."""
    folder = tmp_path / "mychains"
    folder.mkdir()
    shutil.copy(CHAINS / "tools.py", folder / "tools.py")
    text = (CHAINS / "nap.yaml").read_text().replace("name: nap", "name: only_b")
    (folder / "only_b.yaml").write_text(text)
    return folder


def body(chain: str, run_id: str, seconds: float = 0.01) -> dict[str, object]:
    return {"chain": chain, "input": {"seconds": seconds, "label": run_id}, "run_id": run_id}


def status(r: ServeProcess, run_id: str, wait: str = "30s") -> dict[str, object]:
    return dict(r.get(f"/v1/runs/{run_id}", params={"wait": wait}, timeout=60).json())


def test_a_runner_takes_only_runs_of_the_chains_it_serves(redis_url: str, tmp_path: Path) -> None:
    mine = only_b(tmp_path)
    with (
        ServeProcess(store=redis_url, chains=CHAINS) as a,
        ServeProcess(store=redis_url, chains=mine) as b,
    ):
        ids = [f"b-{i}" for i in range(12)]
        for run_id in ids:
            assert b.post("/v1/runs", json=body("only_b", run_id)).status_code == 202
        # Runner a reads all the time and is idle: before, it took about half and dropped them.
        assert [status(b, i)["status"] for i in ids] == ["completed"] * len(ids)
        assert "only_b" not in a.log()
        assert a.post("/v1/runs", json=body("nap", "a-1")).status_code == 202
        assert status(a, "a-1")["status"] == "completed"


@pytest.mark.slow
def test_a_run_no_live_runner_serves_is_shown_as_such(redis_url: str, tmp_path: Path) -> None:
    mine = only_b(tmp_path)
    with ServeProcess(store=redis_url, chains=CHAINS) as a:
        b = ServeProcess(store=redis_url, chains=mine, max_runs=1).start()
        try:
            assert b.post("/v1/runs", json=body("only_b", "long", 60)).status_code == 202
            while status(b, "long", "0s")["status"] == "queued":
                time.sleep(0.1)
            assert b.post("/v1/runs", json=body("only_b", "stuck")).status_code == 202
        finally:
            b.kill()  # kill -9: it cannot say goodbye; its announcement expires
        deadline = time.monotonic() + 30
        while "reason" not in (got := status(a, "stuck", "0s")):
            assert time.monotonic() < deadline, got
            time.sleep(0.5)
        assert got["status"] == "queued"
        assert got["reason"] == "no live runner serves chain 'only_b'"
        rows = a.get("/v1/runs", params={"chain": "only_b", "status": "queued"}).json()
        assert [(r["run_id"], r["reason"]) for r in rows] == [("stuck", got["reason"])]
        fleet = a.get("/v1/fleet").json()
        assert {"chain": "only_b", "waiting": 1} in fleet["unserved"]
        assert 'chainrt_queue_unserved_runs{chain="only_b"} 1.0' in a.get("/metrics").text


def test_submit_wait_gives_up_after_its_timeout_saying_what_it_waited_for(
    redis_url: str,
) -> None:
    with ServeProcess(store=redis_url, chains=CHAINS) as a:
        done = subprocess.run(
            [sys.executable, "-m", "chainrt", "submit", "nap", "--input",
             '{"seconds": 30, "label": "w"}', "--server", a.url, "--wait", "--timeout", "1s"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == EXIT_RUNTIME
        assert "gave up waiting for run" in done.stderr
        assert "after 1s" in done.stderr
        assert "still running" in done.stderr


def test_a_run_refused_as_untrusted_is_failed_with_its_reason(
    redis_url: str, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    spec = load_spec(CHAINS / "nap.yaml").spec
    record = RunRecord(
        run_id="untrusted",
        chain="nap",
        spec=spec_dump(spec),
        source=str(elsewhere),  # outside the runner's chain roots
        input={"seconds": 0.01, "label": "u"},
        status="queued",
        budget_total_ms=10_000,
    )

    async def create() -> None:
        store = open_store(redis_url)
        try:
            await store.create_run(record)
        finally:
            await store.close()

    with ServeProcess(store=redis_url, chains=CHAINS) as a:
        asyncio.run(create())
        client = redis.Redis.from_url(redis_url)
        client.xadd(stream_key("normal", chain="nap"), {"run_id": "untrusted", "op": "start"})
        client.close()
        got = status(a, "untrusted")
        assert got["status"] == "failed"  # it stayed queued, with no visible error, before
        assert "refused" in str(got["error"])
        assert "chain roots" in str(got["error"])
        # The list row says why too (the API's, and chainrt runs --json reading the store).
        (row,) = a.get("/v1/runs", params={"status": "failed", "chain": "nap"}).json()
        assert (row["run_id"], row["reason"]) == ("untrusted", got["error"])
        listed = subprocess.run(
            [sys.executable, "-m", "chainrt", "runs", "--json", "--store", redis_url],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        assert [r["reason"] for r in json.loads(listed.stdout)] == [got["error"]]


def test_a_redis_error_between_record_and_entry_is_a_503_and_leaves_no_queued_run(
    redis_url: str,
) -> None:
    with ServeProcess(store=redis_url, chains=CHAINS) as a:
        client = redis.Redis.from_url(redis_url)
        stream = stream_key("normal", chain="nap")
        client.delete(stream)
        client.set(stream, "not a stream")  # every XADD there now fails (WRONGTYPE)
        answer = a.post("/v1/runs", json=body("nap", "half"))
        client.delete(stream)
        client.close()
        assert answer.status_code == 503
        assert answer.headers["content-type"].startswith("application/json")
        assert "could not be queued" in answer.json()["error"]["message"]
        got = status(a, "half", "0s")
        assert got["status"] == "failed"  # not an orphaned `queued` run
        assert "could not be queued" in str(got["error"])


def test_start_up_is_logged_and_broken_or_duplicate_chain_files_are_reported(
    redis_url: str, tmp_path: Path
) -> None:
    folder = only_b(tmp_path)
    (folder / "broken.yaml").write_text("name: [unclosed\n")
    with ServeProcess(store=redis_url, chains=folder, args=["--access-log"]) as a:
        assert a.get("/v1/chains").status_code == 200
        log = a.log()
        assert f"chainrt serve on http://127.0.0.1:{a.port}" in log
        assert "only_b" in log
        assert "1 files skipped" in log
        assert "chain file skipped" in log
        assert "broken.yaml" in log
        assert "GET /v1/chains" in log  # the access log, asked for
    (folder / "again.yaml").write_text((folder / "only_b.yaml").read_text())
    refused = subprocess.run(
        [sys.executable, "-m", "chainrt", "serve", "--chains", str(folder), "--store",
         redis_url, "--port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "again.yaml" in refused.stderr
    assert "only_b.yaml" in refused.stderr
