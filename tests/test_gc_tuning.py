"""The garbage-collector tuning of chainrt's own processes (``chainrt/_gc.py``).

``tune_gc_for_runner`` changes process-wide state, so it is called in child processes here, never
in the test process; the CLI's calls are checked both in-process (the function replaced by a
recorder: removing a call fails) and end to end (a tool reports the ``chainrt run`` process's
collector).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import chainrt._gc
import chainrt.serve
from chainrt._gc import GC_THRESHOLDS
from chainrt.cli import main

CHAINS = Path(__file__).parent / "data" / "chains"
NOOP = str(CHAINS / "noop.yaml")

_PROBE = """
import gc, json
from chainrt._gc import tune_gc_for_runner
before = gc.get_threshold()
first = tune_gc_for_runner()
frozen = gc.get_freeze_count()
junk = [[i] for i in range(1000)]  # a second freeze would take these too
second = tune_gc_for_runner()
print(json.dumps({"before": before, "first": first, "second": second, "frozen": frozen,
                  "frozen_after": gc.get_freeze_count(), "threshold": gc.get_threshold()}))
"""


def _probe(**env: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_tuning_freezes_start_up_and_raises_the_threshold_once() -> None:
    seen = _probe()
    assert seen["first"] is True
    assert seen["second"] is True
    assert tuple(seen["threshold"]) == GC_THRESHOLDS
    assert seen["frozen"] > 1000  # the imports' objects
    assert seen["frozen_after"] == seen["frozen"]  # the second call froze nothing more


@pytest.mark.parametrize("value", ["0", "false", "off"])
def test_the_setting_turns_it_off(value: str) -> None:
    seen = _probe(CHAINRT_GC_TUNING=value)
    assert seen["first"] is False
    assert seen["second"] is False
    assert seen["threshold"] == seen["before"]
    assert seen["frozen"] == seen["frozen_after"] == 0


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """Record tune_gc_for_runner calls instead of making them; a private SQLite store."""
    seen: list[str] = []

    def record() -> bool:
        seen.append("tuned")
        return True

    monkeypatch.setattr(chainrt._gc, "tune_gc_for_runner", record)
    monkeypatch.setenv("CHAINRT_STORE", f"sqlite:///{tmp_path / 'gc.db'}")
    return seen


@pytest.mark.parametrize("command", ["run", "resume"])
def test_run_and_resume_tune_their_own_process(
    command: str, calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["run", NOOP, "--input", "{}", "--run-id", "r1", "--json"]) == 0
    assert calls == []  # main(argv): an embedding's process is left alone
    argv = ["run", NOOP, "--input", "{}", "--json"] if command == "run" else ["resume", "r1"]
    monkeypatch.setattr(sys, "argv", ["chainrt", *argv])
    main()
    assert calls == ["tuned"]


def test_serve_tunes_its_own_process(calls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[Any] = []

    async def fake_serve(config: Any) -> None:
        served.append(config)

    monkeypatch.setattr(chainrt.serve, "serve", fake_serve)
    monkeypatch.setattr(sys, "argv", ["chainrt", "serve", "--port", "0"])
    assert main() == 0
    assert calls == ["tuned"]
    assert len(served) == 1


def test_a_chainrt_run_process_runs_with_the_tuned_collector(tmp_path: Path) -> None:
    chain = tmp_path / "gc.yaml"
    chain.write_text("name: gc\nbudget: 30s\nsteps:\n  - {id: probe, tool: probe.py:probe}\n")
    (tmp_path / "probe.py").write_text(
        "import gc\n\n\ndef probe() -> dict:\n"
        "    return {'threshold': list(gc.get_threshold()), 'frozen': gc.get_freeze_count()}\n"
    )
    env = {**os.environ, "CHAINRT_STORE": f"sqlite:///{tmp_path / 'gc.db'}"}
    outputs = []
    for extra in ({}, {"CHAINRT_GC_TUNING": "0"}):
        done = subprocess.run(
            [sys.executable, "-m", "chainrt", "run", str(chain), "--input", "{}", "--json"],
            capture_output=True,
            text=True,
            env={**env, **extra},
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(done.stdout)["output"])
    tuned, untuned = outputs
    assert tuple(tuned["threshold"]) == GC_THRESHOLDS
    assert tuned["frozen"] > 1000
    assert tuple(untuned["threshold"]) != GC_THRESHOLDS
    assert untuned["frozen"] == 0
