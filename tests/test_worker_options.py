"""``chainrt-worker serve`` refuses every bad option in one line naming it, before loading a
model (a check across options, such as the admin token's length, included: it has no field)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("--admin-token", "short"),
            "chainrt-worker: bad options: the admin token must be at least 16 characters",
        ),
        (
            ("--served-model-name", ""),
            "chainrt-worker: bad options: served model names must not be empty strings",
        ),
        (("--watermark", "2"), "chainrt-worker: bad option --watermark: Input should be less"),
        (("--max-waiting", "-1"), "chainrt-worker: bad option --max-waiting: Input should be"),
        (("--max-body-bytes", "10"), "chainrt-worker: bad option --max-body-bytes: Input should"),
        (("--health-interval", "0"), "chainrt-worker: bad option --health-interval: Input"),
    ],
)
def test_a_bad_option_is_one_line(args: tuple[str, ...], line: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "serve", "--engine", "local", "--port", "1", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # no traceback (it was an IndexError)
    assert lines[0].startswith(line), lines[0]
