"""A real ``chainrt-worker`` subprocess for tests: free port, waits for ``/health/ready``.

    with WorkerProcess("--engine", "local") as worker:
        client = worker.openai()            # the official OpenAI client, retries off
        worker.get("/metrics")

Started as ``python -m workers.cli`` so it needs no installed console script. Its log goes to a
temporary file, shown when start-up fails.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import httpx2  # the HTTP library of the openai package (its http_client type)
from openai import AsyncOpenAI, OpenAI

from chainrt.testing.redis_server import free_port

__all__ = ["WorkerProcess", "fault_worker", "free_port", "metric_value"]

REPO = Path(__file__).resolve().parent.parent


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus exposition text (0.0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$", line)
        if match is None or match.group(1) != name:
            continue
        have = ",".join(sorted((match.group(2) or "").split(","))) if match.group(2) else ""
        if have == want:
            return float(match.group(3))
    return 0.0


_BIND_TRIES = 3
"""Starts of a worker whose port another process took before the worker bound it."""


class _PortTaken(Exception):
    """The worker exited because its port was taken before it could bind it."""


class WorkerProcess:
    """``chainrt-worker serve`` in a subprocess, on a free port or a Unix socket."""

    def __init__(self, *args: str, uds: str | None = None, ready_timeout_s: float = 90.0) -> None:
        self.uds = uds
        self.port = None if uds else free_port()
        where = ["--uds", uds] if uds else ["--port", str(self.port)]
        self.argv = [sys.executable, "-m", "workers.cli", "serve", *args, *where]
        self.base = "http://worker" if uds else f"http://127.0.0.1:{self.port}"
        self._ready_timeout_s = ready_timeout_s
        self._log = tempfile.NamedTemporaryFile(prefix="chainrt-worker-", suffix=".log")  # noqa: SIM115
        self.process: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=self.base, transport=self._transport(), timeout=30)
        self._openai: OpenAI | None = None
        self._openai_lock = threading.Lock()  # tests call openai() from several threads at once

    def _transport(self) -> httpx.HTTPTransport:
        return httpx.HTTPTransport(uds=self.uds) if self.uds else httpx.HTTPTransport()

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> WorkerProcess:
        """Start the worker and wait until ``/health/ready`` answers 200.

        The port was free when it was picked, but the worker binds it only once its engine is
        loaded (seconds later): a process that took it meanwhile (a Redis cluster node's bus
        port, another suite's server) makes the worker exit with "address already in use". It
        is started again on another free port then, up to :data:`_BIND_TRIES` times in all.
        """
        for attempt in range(1, _BIND_TRIES + 1):
            try:
                return self._start_once()
            except _PortTaken:
                if attempt == _BIND_TRIES:
                    raise RuntimeError(
                        f"worker could not bind a free port in {_BIND_TRIES} tries:\n{self.logs()}"
                    ) from None
                self._move_to(free_port())
        raise AssertionError("unreachable")

    def _move_to(self, port: int) -> None:
        """Use ``port`` for the next start (a fresh log, client and argv)."""
        self.http.close()
        self.port = port
        self.argv[-1] = str(port)
        self.base = f"http://127.0.0.1:{port}"
        self.http = httpx.Client(base_url=self.base, transport=self._transport(), timeout=30)
        self._log.close()
        self._log = tempfile.NamedTemporaryFile(prefix="chainrt-worker-", suffix=".log")  # noqa: SIM115

    def _start_once(self) -> WorkerProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), env.get("PYTHONPATH")] if p)
        self.process = subprocess.Popen(
            self.argv, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + self._ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                logs = self.logs()
                if not self.uds and "address already in use" in logs:
                    raise _PortTaken(logs)
                raise RuntimeError(f"worker exited with {self.process.returncode}:\n{logs}")
            # httpcore leaks the socket of a failed Unix-socket connect: wait for the file first.
            if self.uds and not Path(self.uds).exists():
                time.sleep(0.1)
                continue
            try:
                if self.http.get("/health/ready", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"worker not ready after {self._ready_timeout_s}s:\n{self.logs()}")

    def stop(self) -> None:
        """Terminate the worker (SIGTERM, then SIGKILL after 10 s)."""
        self.http.close()
        if self._openai is not None:
            self._openai.close()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def logs(self) -> str:
        """What the worker printed so far."""
        return Path(self._log.name).read_text(errors="replace")

    @property
    def alive(self) -> bool:
        """True while the process runs."""
        return self.process is not None and self.process.poll() is None

    def get(self, path: str, **kw: Any) -> httpx.Response:
        """GET on the worker."""
        return self.http.get(path, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        """POST on the worker."""
        return self.http.post(path, **kw)

    def metric(self, name: str, **labels: str) -> float:
        """One metric's current value."""
        return metric_value(self.get("/metrics").text, name, **labels)

    def openai(self) -> OpenAI:
        """The official OpenAI client pointed at the worker (no retries, so errors surface).

        One client per worker, closed with it, also when threads ask for it at once (a client
        built by a race would never be closed: its sockets would be reported as unclosed later).
        """
        with self._openai_lock:
            if self._openai is None:
                client = httpx2.Client(transport=httpx2.HTTPTransport(uds=self.uds), timeout=60)
                self._openai = OpenAI(
                    base_url=f"{self.base}/v1", api_key="unused", max_retries=0, http_client=client
                )
            return self._openai

    def async_openai(self) -> AsyncOpenAI:
        """A new async OpenAI client pointed at the worker (no retries); the caller closes it."""
        transport = httpx2.AsyncHTTPTransport(uds=self.uds)
        client = httpx2.AsyncClient(transport=transport, timeout=60)
        return AsyncOpenAI(
            base_url=f"{self.base}/v1", api_key="unused", max_retries=0, http_client=client
        )


def fault_worker(engine: str = "local", served: str = "smol") -> WorkerProcess:
    """A started worker with fault injection on (``/admin/faults``), serving ``served``.

    No periodic probe generations (they would compete with the test's requests for the CPU).
    """
    return WorkerProcess(
        "--engine", engine,
        "--served-model-name", served,
        "--enable-fault-injection",
        "--health-interval", "300",
        "--log-level", "warning",
    ).start()  # fmt: skip
