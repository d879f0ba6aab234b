"""Processes of ``helpers/limiter_worker.py``, shared by the multi-process limiter tests
(``test_limiter_multiprocess.py`` on Redis, ``test_limiter_sqlite.py`` on one SQLite file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["LimiterWorkers"]

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "helpers" / "limiter_worker.py"


class LimiterWorkers:
    """Starts limiter worker processes against ``url`` and makes sure none outlives the test.

    ``common`` is passed to every worker after its mode, URL and key (e.g. a start file)."""

    def __init__(self, url: str, *common: str) -> None:
        self.url = url
        self.common = common
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, mode: str, key: str, *args: str) -> subprocess.Popen[str]:
        """Start one worker in ``mode`` on ``key``; its stdout is a text pipe."""
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), mode, "--url", self.url, "--key", key,
             *self.common, *args],
            stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        """Kill the workers still running and reap them all."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
