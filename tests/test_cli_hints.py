"""What the CLIs print about themselves: the resume hint's real values, ``chainrt-worker --version``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import chainrt
from chainrt.cli._printer import duration_arg, resume_command

FAILING_CHAIN = """\
name: failing
budget: 2500ms
inputs: {x: int}
steps:
  - id: boom
    tool: tools.py:boom
    args: {x: "{{ input.x }}"}
"""


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (8000, "8s"),
        (600, "600ms"),
        (1500, "1.5s"),
        (2500, "2.5s"),
        (1234, "1234ms"),
        (120000, "120s"),
    ],
)
def test_duration_arg(ms: float, text: str) -> None:
    assert duration_arg(ms) == text


def test_resume_command_quotes_and_masks() -> None:
    line = resume_command(
        "r 1",
        budget_ms=600,
        store="redis://:s3cret@db:6379/0",
        pool="my pool.yaml",
        chains=["/srv/x y"],
    )
    assert "s3cret" not in line
    assert line.startswith("chainrt resume 'r 1' --budget 600ms --store ")
    assert line.endswith("--pool 'my pool.yaml' --chains '/srv/x y'")
    assert resume_command("r1") == "chainrt resume r1"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CHAINRT_CHAIN_ROOTS"}
    return subprocess.run(
        [sys.executable, "-m", "chainrt", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=90,
        check=False,
    )


def test_the_hint_names_the_budget_store_and_chain_root_a_resume_needs(tmp_path: Path) -> None:
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "tools.py").write_text("def boom(x):\n    raise ValueError('no')\n")
    (folder / "failing.yaml").write_text(FAILING_CHAIN)
    work = tmp_path / "work"
    work.mkdir()
    store = f"sqlite:///{tmp_path}/runs.db"
    done = _cli(
        "run", str(folder / "failing.yaml"), "--input", '{"x": 1}', "--store", store,
        "--run-id", "r1", "--budget", "1500ms", cwd=work,
    )  # fmt: skip
    assert done.returncode == 1
    hint = next(line for line in done.stdout.splitlines() if line.startswith("resume with: "))
    command = hint.removeprefix("resume with: ")
    assert command == f"chainrt resume r1 --budget 1.5s --store {store} --chains {folder}"
    assert "8s" not in hint
    # The printed command is the one that works: the folder is outside the default root.
    (folder / "tools.py").write_text("def boom(x):\n    return x\n")
    resumed = _cli(*command.split()[1:], cwd=work)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert chainrt.__version__  # (the package imports)


def test_a_chain_under_the_default_root_needs_no_chains_flag(tmp_path: Path) -> None:
    folder = tmp_path / "chains"
    folder.mkdir()
    (folder / "tools.py").write_text("def boom(x):\n    raise ValueError('no')\n")
    (folder / "failing.yaml").write_text(FAILING_CHAIN)
    done = _cli(
        "run", "chains/failing.yaml", "--input", '{"x": 1}',
        "--store", f"sqlite:///{tmp_path}/runs.db", "--run-id", "r2", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1
    assert (
        f"resume with: chainrt resume r2 --budget 2.5s --store sqlite:///{tmp_path}/runs.db\n"
        in (done.stdout)
    )


def test_chainrt_worker_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "workers", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"chainrt-worker {chainrt.__version__}"
