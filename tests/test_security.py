"""A tampered store cannot run code (issue 12, finding 1), on SQLite and on a real Redis.

The attack: a crashed run's record is rewritten in the store — its chain folder set to the
standard library, a step's tool to ``os.py:popen``, its args to a shell command — and someone
(or a runner service claiming orphans) resumes it. The runner must refuse before it claims the
run, because the folder is outside its chain roots; with ``CHAINRT_RECORD_KEY`` it also refuses
any record whose signature does not match.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

import chainrt
from chainrt import UntrustedRecord
from chainrt.redis.keys import StoreKeys
from chainrt.spec import spec_from_dict
from chainrt.store import open_store
from chainrt.store._scripts import RunFields

STDLIB = Path(os.__file__).parent

CHAIN = """\
name: crash
budget: 20s
inputs:
  marker: str
  text: str
steps:
  - id: one
    tool: tools.py:echo
    args: {text: "{{ input.text }}"}
  - id: two
    tool: tools.py:crash_once
    args: {marker: "{{ input.marker }}"}
output: "{{ steps.one.output }}"
"""

TOOLS = """\
import os
from pathlib import Path


def echo(text):
    return text


def crash_once(marker):
    flag = Path(marker)
    if not flag.exists():
        flag.write_text("crashed")
        os._exit(17)
    return "survived"
"""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A project folder: ``chains/crash.yaml`` and its ``tools.py``."""
    chains = tmp_path / "project" / "chains"
    chains.mkdir(parents=True)
    (chains / "crash.yaml").write_text(CHAIN, encoding="utf-8")
    (chains / "tools.py").write_text(TOOLS, encoding="utf-8")
    return tmp_path / "project"


def chainrt_cli(
    *args: str, cwd: Path, store: str, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAINRT_")}
    env.update({"CHAINRT_STORE": store, **(extra_env or {})})
    return subprocess.run(
        [sys.executable, "-m", "chainrt", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=60,
    )


def crash(home: Path, store: str, run_id: str, env: dict[str, str] | None = None) -> None:
    """Run the chain until its second step kills the process: the run stays ``running``."""
    inputs = json.dumps({"marker": str(home / f"{run_id}.crashed"), "text": "hello"})
    done = chainrt_cli(
        "run", "chains/crash.yaml", "--input", inputs, "--run-id", run_id, "--json",
        cwd=home, store=store, extra_env=env,
    )  # fmt: skip
    assert done.returncode == 17, done.stderr


def stored_record(store: str, run_id: str) -> dict[str, Any]:
    if store.startswith("sqlite"):
        with sqlite3.connect(store.removeprefix("sqlite:///")) as conn:
            (raw,) = conn.execute(
                "SELECT record FROM run_records WHERE run_id = ?", (run_id,)
            ).fetchone()
    else:
        client = redis.Redis.from_url(store)
        raw = client.hget(StoreKeys().run(run_id), RunFields.RECORD)
        client.close()
    data: dict[str, Any] = json.loads(raw)
    return data


def write_record(store: str, run_id: str, data: dict[str, Any]) -> None:
    """What an attacker with write access to the store does."""
    raw = json.dumps(data)
    if store.startswith("sqlite"):
        with sqlite3.connect(store.removeprefix("sqlite:///")) as conn:
            conn.execute("UPDATE run_records SET record = ? WHERE run_id = ?", (raw, run_id))
    else:
        client = redis.Redis.from_url(store)
        client.hset(StoreKeys().run(run_id), RunFields.RECORD, raw)
        client.close()


def popen_step(marker: Path, tool: str) -> dict[str, Any]:
    return {"id": "two", "tool": tool, "args": {"cmd": f"touch {marker}"}}


def test_the_issue_attack_is_refused_and_runs_nothing(home: Path, store_url: str) -> None:
    crash(home, store_url, "atk-1")
    marker = home / "pwned"
    record = stored_record(store_url, "atk-1")
    record["source"] = str(STDLIB)
    record["spec"]["steps"][1] = popen_step(marker, "os.py:popen")
    write_record(store_url, "atk-1", record)

    resumed = chainrt_cli("resume", "atk-1", cwd=home, store=store_url)
    assert resumed.returncode == 3, resumed.stderr
    lines = resumed.stderr.strip().splitlines()
    assert len(lines) == 1, resumed.stderr
    assert "outside this runner's chain roots" in lines[0]
    assert str(STDLIB) in lines[0]
    assert not marker.exists()
    inspect = chainrt_cli("inspect", "atk-1", "--json", cwd=home, store=store_url)
    after = json.loads(inspect.stdout)
    assert after["status"] == "running"  # not claimed, not changed
    assert [s["id"] for s in after["steps"]] == ["one"]


def test_the_untampered_run_resumes_from_the_same_place(home: Path, store_url: str) -> None:
    """The control: the same crash, not tampered with, resumes and completes."""
    crash(home, store_url, "ok-1")
    resumed = chainrt_cli("resume", "ok-1", "--json", cwd=home, store=store_url)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["output"] == "hello"


@pytest.mark.parametrize(
    ("source", "tool", "refusal"),
    [
        ("stdlib", "os.py:popen", "outside this runner's chain roots"),
        ("chains", "escape", "outside the chain's directory"),
        ("chains", "os:popen", "module 'os' is not allowed"),
        ("missing", "tools.py:echo", "outside this runner's chain roots"),
    ],
)
async def test_stored_references_resolve_only_inside_chain_roots(
    home: Path,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    source: str,
    tool: str,
    refusal: str,
) -> None:
    """Written straight into the store (as a store writer could), then resumed in-process."""
    monkeypatch.chdir(home)
    chains = home / "chains"
    folder = {"stdlib": STDLIB, "chains": chains, "missing": None}[source]
    if tool == "escape":
        tool = os.path.relpath(STDLIB / "os.py", chains) + ":popen"
    marker = home / "pwned"
    spec = spec_from_dict(
        {
            "name": "evil",
            "budget": "5s",
            "steps": [popen_step(marker, tool)],
        }
    )
    if folder is None:
        monkeypatch.chdir(home.parent)  # no source recorded: the working directory is used
    await write_run(store_url, "evil-1", spec.model_dump(mode="json", by_alias=True), folder)
    with pytest.raises(UntrustedRecord, match=refusal) as info:
        await chainrt.aresume("evil-1", store=store_url)
    assert "\n" not in str(info.value)
    assert not marker.exists()
    store = open_store(store_url)
    try:
        run = await store.get_run("evil-1")
    finally:
        await store.close()
    assert (run.status, run.fencing_token) == ("running", 1)  # not claimed


async def write_run(store_url: str, run_id: str, spec: dict[str, Any], source: Path | None) -> None:
    from chainrt._records import RunRecord

    store = open_store(store_url)
    try:
        await store.create_run(
            RunRecord(
                run_id=run_id,
                chain=str(spec["name"]),
                spec=spec,
                source=None if source is None else str(source),
                input={},
                budget_total_ms=5000,
                fencing_token=1,
            )
        )
    finally:
        await store.close()


def test_a_chain_folder_outside_the_roots_needs_chains_to_resume(
    home: Path, store_url: str, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    (home / "chains").rename(elsewhere)
    inputs = json.dumps({"marker": str(tmp_path / "m"), "text": "hi"})
    done = chainrt_cli(
        "run", str(elsewhere / "crash.yaml"), "--input", inputs, "--run-id", "far-1",
        cwd=home, store=store_url,
    )  # fmt: skip
    assert done.returncode == 17, done.stderr
    refused = chainrt_cli("resume", "far-1", cwd=home, store=store_url)
    assert refused.returncode == 3
    assert "--chains" in refused.stderr
    allowed = chainrt_cli(
        "resume", "far-1", "--chains", str(elsewhere), "--json", cwd=home, store=store_url
    )
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["status"] == "completed"
    # Completed, it is returned as it is, without --chains: nothing of it runs any more.
    again = chainrt_cli("resume", "far-1", "--json", cwd=home, store=store_url)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["output"] == "hi"


KEY = {"CHAINRT_RECORD_KEY": "a secret only the runners know"}


@pytest.mark.parametrize(
    ("tamper", "refusal"),
    [
        ("input", "signature does not match"),
        ("args", "signature does not match"),
        ("unsigned", "is not signed"),
    ],
)
def test_signed_records_refuse_any_change(
    home: Path, store_url: str, tamper: str, refusal: str
) -> None:
    crash(home, store_url, "signed-1", env=KEY)
    record = stored_record(store_url, "signed-1")
    assert str(record["mac"]).startswith("hmac-sha256:")
    if tamper == "input":
        record["input"]["text"] = "$(reboot)"
    elif tamper == "args":
        record["spec"]["steps"][0]["args"] = {"text": "something else"}
    else:
        record["mac"] = None
    write_record(store_url, "signed-1", record)
    refused = chainrt_cli("resume", "signed-1", cwd=home, store=store_url, extra_env=KEY)
    assert refused.returncode == 3
    assert refused.stderr.count("\n") == 1
    assert refusal in refused.stderr


def test_a_signed_record_resumes_with_the_key_only(home: Path, store_url: str) -> None:
    crash(home, store_url, "signed-2", env=KEY)
    wrong = chainrt_cli(
        "resume", "signed-2", cwd=home, store=store_url,
        extra_env={"CHAINRT_RECORD_KEY": "another key"},
    )  # fmt: skip
    assert wrong.returncode == 3
    assert "signature does not match" in wrong.stderr
    right = chainrt_cli("resume", "signed-2", "--json", cwd=home, store=store_url, extra_env=KEY)
    assert right.returncode == 0, right.stderr
    assert json.loads(right.stdout)["status"] == "completed"


async def test_a_chain_naming_an_imported_callable_fails_and_calls_nothing(
    tmp_path: Path, store_url: str
) -> None:
    """Issue 12 finding 9: the file's own functions only, whatever kind of callable is named."""
    marker = tmp_path / "ran"
    (tmp_path / "bm.py").write_text(
        f"import functools\nimport os\nsystem = functools.partial(os.system, 'touch {marker}')\n",
        encoding="utf-8",
    )
    (tmp_path / "bm.yaml").write_text(
        "name: bm\nbudget: 5s\nsteps:\n  - {id: a, tool: 'bm.py:system'}\n", encoding="utf-8"
    )
    result = await chainrt.load(tmp_path / "bm.yaml").arun({}, store=store_url)
    assert result.status == "failed"
    assert result.error is not None
    assert "is posix.system, imported into bm.py from elsewhere" in result.error
    assert not marker.exists()


def test_runs_queued_by_chainrt_serve_are_signed_and_start(tmp_path: Path) -> None:
    """A queued run starts through the same checks as a resume: it must carry the signature."""
    from chainrt.testing.serve_process import ServeProcess

    store = f"sqlite:///{tmp_path / 'runs.db'}"
    serve_chains = Path(__file__).parent / "data" / "serve"
    with ServeProcess(store=store, chains=serve_chains, max_runs=1, env=KEY) as runner:
        posted = runner.post("/v1/runs", json={"chain": "five", "input": {}, "run_id": "q-1"})
        assert posted.status_code == 202, posted.text
        final = runner.get("/v1/runs/q-1", params={"wait": "30s"}).json()
    assert final["status"] == "completed", final
    assert str(stored_record(store, "q-1")["mac"]).startswith("hmac-sha256:")
