"""``chainrt-worker serve`` refuses a socket path it cannot bind in one line, before loading."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", "serve", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )


def _one_line(done: subprocess.CompletedProcess[str], path: Path) -> str:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"chainrt-worker: --uds {path}:")
    return lines[0]


def test_a_missing_uds_folder_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "w.sock"
    line = _one_line(serve("--engine", "local", "--uds", str(path)), path)
    assert f"folder {tmp_path / 'missing'} does not exist" in line


def test_a_uds_path_that_is_a_plain_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "plain"
    path.write_text("not a socket")
    line = _one_line(serve("--engine", "local", "--uds", str(path)), path)
    assert "not a socket" in line
    assert path.read_text() == "not a socket"  # left as it was
