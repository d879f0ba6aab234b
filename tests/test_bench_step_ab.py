"""``bench/step_ab.py``: two runner processes, one per checkout, take turns and are compared;
the base's worktree is removed afterwards, and bad arguments are a usage error."""

from __future__ import annotations

import re
import subprocess
import sys

from bench_loader import REPO

BENCH = REPO / "bench" / "step_ab.py"


def _worktrees() -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True, check=True
    )
    return done.stdout


def test_both_sides_run_in_paired_rounds_and_the_base_worktree_goes_away() -> None:
    before = _worktrees()
    done = subprocess.run(
        [sys.executable, str(BENCH), "--base", "HEAD", "--level", "2", "--steps", "3",
         "--rounds", "2"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "2 runs at once x 3 no-op tool steps, 2 paired rounds" in out
    base = re.search(
        r"^base  (\S+): CPU ([\d.]+) us/step, ([\d,]+) steps/s .* ([\d,]+) B/step", out, re.M
    )
    this = re.search(
        r"^this  (\S+): CPU ([\d.]+) us/step, ([\d,]+) steps/s .* ([\d,]+) B/step", out, re.M
    )
    assert base is not None, out
    assert this is not None, out
    assert "chainrt-ab-" in base.group(1)  # the base ran from its own checkout
    assert base.group(1) != this.group(1)
    for found in (base, this):
        assert float(found.group(2)) > 0  # CPU per step
        assert int(found.group(3).replace(",", "")) > 0  # steps/s
        assert int(found.group(4).replace(",", "")) > 0  # bytes held per step
    assert re.search(r"^CPU per step +this / base per round: median [\d.]+ ", out, re.M)
    assert re.search(r"^steps/s +this / base per round: median [\d.]+ ", out, re.M)
    assert _worktrees() == before


def test_bad_arguments_are_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--base", "HEAD", "--rounds", "1"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--rounds at least 2" in done.stderr
