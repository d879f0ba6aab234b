"""A real ``chainrt serve`` child process for tests, drills and benches.

    with ServeProcess(store=redis.url, chains="tests/data/serve") as runner:
        runner.post("/v1/runs", json={...})
        runner.kill()      # kill -9;   runner.start() brings it back on the same port

Started as ``python -m chainrt serve`` on a free port; ``start`` returns once
``/health/ready`` answers 200. Its output goes to a log file, shown when start-up fails.
``hostname`` runs it in a UTS namespace of its own under that host name (``unshare -u``, root
on Linux): its leases then name another host, as a runner on another machine's would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from .redis_server import free_port

__all__ = ["ServeProcess"]


class ServeProcess:
    """One ``chainrt serve`` process (see the module docstring)."""

    def __init__(
        self,
        *,
        store: str,
        chains: str | os.PathLike[str],
        max_runs: int = 16,
        drain: str = "10s",
        env: dict[str, str] | None = None,
        port: int | None = None,
        startup_s: float = 60.0,
        hostname: str | None = None,
        args: Sequence[str] = (),
    ) -> None:
        self.store = store
        self.chains = str(chains)
        self.max_runs = max_runs
        self.drain = drain
        self.port = port or free_port()
        self.env = env or {}
        self.startup_s = startup_s
        self.hostname = hostname
        self.args = list(args)  # more `chainrt serve` flags (--tokens, --max-body, ...)
        self.process: subprocess.Popen[bytes] | None = None
        self._log = Path(tempfile.mkstemp(prefix="chainrt-serve-", suffix=".log")[1])

    @property
    def url(self) -> str:
        """The server's base URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The process id (it must be running)."""
        assert self.process is not None
        return self.process.pid

    def start(self) -> ServeProcess:
        """Start the process and wait until it is ready."""
        command = [
            sys.executable,
            "-m",
            "chainrt",
            "serve",
            "--port",
            str(self.port),
            "--chains",
            self.chains,
            "--store",
            self.store,
            "--max-runs",
            str(self.max_runs),
            "--drain",
            self.drain,
            *self.args,
        ]
        if self.hostname is not None:  # exec keeps the pid: kill() still hits the runner
            command = [
                "unshare",
                "-u",
                "sh",
                "-c",
                'hostname "$0" && exec "$@"',
                self.hostname,
                *command,
            ]
        env = {**os.environ, **self.env}
        with self._log.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.startup_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"chainrt serve exited at start-up:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/health/ready", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"chainrt serve not ready in {self.startup_s}s:\n{self.log()}")

    def log(self) -> str:
        """What the process printed so far (its last 4000 characters)."""
        return self._log.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        """``kill -9``: no clean-up at all."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def terminate(self) -> None:
        """SIGTERM: the runner drains and exits."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit; its exit code."""
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        """SIGTERM, then kill -9 if it has not exited within 15 s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill()

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        """GET ``path`` on this server."""
        return httpx.get(f"{self.url}{path}", timeout=kwargs.pop("timeout", 30.0), **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        """POST ``path`` on this server; with no body given, an empty JSON object (the server
        takes state-changing requests as JSON only)."""
        if not {"json", "content", "data", "files"} & kwargs.keys():
            kwargs["json"] = {}
        return httpx.post(f"{self.url}{path}", timeout=kwargs.pop("timeout", 30.0), **kwargs)

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        self._log.unlink(missing_ok=True)
