"""A resume that finds the run completed by another process returns its result (issue 12,
finding 11): exit 0 with the result, as resuming a completed run always did — not exit 3 with "a
completed run cannot be claimed". Both ways it can happen are tested: the owner finishes while
the resume waits for its lease, and another process finishes it between the resume's read and
its claim.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import pytest

import chainrt
from chainrt._records import OwnerLease, RunRecord
from chainrt._runner import Runner
from chainrt.concurrency import LocalLimiter
from chainrt.dispatch import make_dispatcher
from chainrt.store import CheckpointStore, open_store

CHAIN = """\
name: slow
budget: 30s
inputs:
  marker: str
steps:
  - id: work
    tool: tools.py:work
    args: {marker: "{{ input.marker }}"}
output: "{{ steps.work.output }}"
"""

TOOLS = """\
import json
import os
import time
from pathlib import Path


def work(marker):
    with open(os.environ["CHAINRT_TEST_LOG"], "a") as fh:
        fh.write(json.dumps({"tool": "work", "pid": os.getpid()}) + "\\n")
    Path(marker).write_text("started")
    time.sleep(2.0)
    return "done"
"""


@pytest.fixture
def chains(tmp_path: Path) -> Path:
    folder = tmp_path / "chains"
    folder.mkdir()
    (folder / "slow.yaml").write_text(CHAIN, encoding="utf-8")
    (folder / "tools.py").write_text(TOOLS, encoding="utf-8")
    return folder


def log_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_resume_waiting_on_a_live_owner_returns_its_result(chains: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAINRT_")}
    log = tmp_path / "calls.jsonl"
    env.update({"CHAINRT_STORE": f"sqlite:///{tmp_path / 'runs.db'}", "CHAINRT_TEST_LOG": str(log)})
    marker = tmp_path / "started"
    args = [sys.executable, "-m", "chainrt"]
    owner = subprocess.Popen(
        [*args, "run", "chains/slow.yaml", "--input", json.dumps({"marker": str(marker)}),
         "--run-id", "twice-1", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert owner.poll() is None, owner.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        # The owner is alive and inside its 2 s step: the resume waits for its lease...
        resumed = subprocess.run(
            [*args, "resume", "twice-1", "--json"],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
        )  # fmt: skip
        out, err = owner.communicate(timeout=60)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.communicate()
    assert owner.returncode == 0, err
    # ...and the owner completes it meanwhile: the resume's answer is that result, exit 0.
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "completed"
    assert json.loads(resumed.stdout)["output"] == json.loads(out)["output"] == "done"
    assert [entry["pid"] for entry in log_lines(log)] == [owner.pid]  # the tool ran once


class _FinishedBeforeClaim:
    """A real store; just before the resume's claim, another runner finishes the run."""

    def __init__(self, store: CheckpointStore, finish: Any) -> None:
        self._store = store
        self._finish = finish

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def claim(self, run_id: str, expected_token: int, owner: OwnerLease) -> int:
        await self._finish()
        return await self._store.claim(run_id, expected_token, owner)


async def test_a_run_finished_between_read_and_claim_is_returned(
    chains: Path, tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("CHAINRT_TEST_LOG", str(log))
    chain = chainrt.load(chains / "slow.yaml")
    store = open_store(store_url)
    limiter = LocalLimiter()
    dispatcher = make_dispatcher(None)
    try:
        # A run whose owner crashed on another host: its lease has lapsed.
        await store.create_run(
            RunRecord(
                run_id="race-1",
                chain="slow",
                spec=chain.spec.model_dump(mode="json", by_alias=True),
                source=str(chains),
                input={"marker": str(tmp_path / "m")},
                budget_total_ms=30_000,
                owner=OwnerLease(host="gone", pid=1, token=1, expires_at=time.time() - 1),
                fencing_token=1,
            )
        )

        async def finish() -> None:  # another process resumes and completes it first
            other = Runner(store, dispatcher, limiter, lease_ttl_s=0.5, host="other-host")
            assert (await other.resume("race-1")).status == "completed"

        racing = Runner(cast(CheckpointStore, _FinishedBeforeClaim(store, finish)), dispatcher,
                        limiter, lease_ttl_s=0.5, host="third-host")  # fmt: skip
        result = await racing.resume("race-1")
    finally:
        await dispatcher.close()
        await limiter.close()
        await store.close()
    assert result.status == "completed"
    assert result.output == "done"
    assert len(log_lines(log)) == 1  # only the other process ran the tool
