"""Start real ``chainrt-worker`` processes (or the stub OpenAI server) for the dispatch
benchmarks: free port, wait until ready. Also the benchmarks' one way to print percentiles."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from chainrt.testing.redis_server import free_port

ROOT = Path(__file__).resolve().parent.parent

QUANTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "p99.9": 0.999}
"""The percentile names :func:`percentiles` prints."""


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank: a value that was measured)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def percentiles(
    values: Sequence[float], *names: str, width: int = 8, digits: int = 3, sep: str = "   "
) -> str:
    """``p50 1.234 ms   p99 5.678 ms``: the named percentiles of ``values`` (in ms), ``max``
    for the largest (default: p50 and p99)."""
    parts = []
    for name in names or ("p50", "p99"):
        value = max(values) if name == "max" else pct(values, QUANTILES[name])
        parts.append(f"{name} {value:{width}.{digits}f} ms")
    return sep.join(parts)


class BenchWorker:
    """One ``python -m workers.cli serve --engine local ...`` process on a free port."""

    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.argv = [sys.executable, "-m", "workers.cli", "serve", *args, "--port", str(self.port)]
        self._log = tempfile.NamedTemporaryFile(prefix="bench-worker-", suffix=".log")  # noqa: SIM115
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120.0) -> BenchWorker:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH")] if p)
        self.process = subprocess.Popen(
            self.argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited:\n{Path(self._log.name).read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base}/health/ready", timeout=2).status_code == 200:
                    return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"worker not ready after {timeout_s}s")

    def faults(self, **change: Any) -> None:
        """POST /admin/faults (the worker must run with --enable-fault-injection)."""
        httpx.post(f"{self.base}/admin/faults", json=change, timeout=5).raise_for_status()

    async def afaults(self, client: httpx.AsyncClient, **change: Any) -> None:
        """The same, from async code."""
        (await client.post(f"{self.base}/admin/faults", json=change, timeout=5)).raise_for_status()

    def stop(self) -> None:
        """Terminate (SIGTERM, then SIGKILL after 10 s)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._log.close()


@contextlib.contextmanager
def local_workers(
    count: int, *extra: str, served: str = "smol", engine: str = "local"
) -> Iterator[list[BenchWorker]]:
    """``count`` workers (``engine``: local by default) serving the model name ``served``."""
    started: list[BenchWorker] = []
    try:
        for _ in range(count):
            args = ["--engine", engine, "--served-model-name", served, "--log-level", "warning"]
            started.append(BenchWorker(*args, *extra).start())
        yield started
    finally:
        for worker in started:
            worker.stop()


@contextlib.contextmanager
def stub_server(*extra: str) -> Iterator[str]:
    """``bench/_stub_openai.py`` in its own process (``extra``: its options); yields its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "_stub_openai.py"), "--port", str(port), *extra]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health/ready", timeout=1).status_code == 200:
                    break
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
