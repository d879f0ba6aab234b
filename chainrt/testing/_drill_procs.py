"""Runner processes for the crash drill (``drill.py``): forked from a warm server, or the CLI.

A fresh interpreter needs about half a second to import chainrt; a thousand drilled runs of
several processes each would spend most of their time there. The *fork server*
(``python -m chainrt.testing._drill_procs CHAIN``) imports chainrt once, then forks one child per
request: a real, separate runner process that starts in milliseconds. The server kills its own
child through a pidfd before reaping it, so no pid is ever signalled after it could be reused.
:func:`run_cli` starts the real ``python -m chainrt run|resume ... --json`` instead.

Requests and replies are JSON lines (:class:`SpawnRequest`, :class:`SpawnReply`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn, TypedDict

from .._errors import ChainRTError

__all__ = ["HANG_S", "ForkServer", "SpawnReply", "SpawnRequest", "run_cli"]

HANG_S = 120.0
"""A runner process that runs this long is stuck: it is killed (and its run reported)."""


class SpawnRequest(TypedDict):
    """Start one runner process."""

    mode: str  # "run" or "resume"
    run_id: str
    input: dict[str, Any]
    store: str
    lease_ttl_s: float
    foreign_host: bool  # claim a host name of its own (fork server only)
    kill_after: float | None  # SIGKILL it after this many seconds (None: let it end)
    err: str  # file that receives its stdout and stderr
    from_first_step: bool  # count kill_after from the process's first step, not its start (CLI)


class SpawnReply(TypedDict):
    """How that process ended."""

    pid: int
    killed: bool
    code: int | None  # exit code when not killed
    started_at: float
    ended_at: float


class ForkServer:
    """The fork server as a child of this process, started on first use."""

    def __init__(self, chain: Path) -> None:
        self.chain = chain
        self._proc: subprocess.Popen[str] | None = None

    def spawn(self, request: SpawnRequest) -> SpawnReply:
        """Fork one runner child for ``request`` and wait until it ends or is killed."""
        if self._proc is None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "chainrt.testing._drill_procs", str(self.chain)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the drill's fork server exited with code {self._proc.wait()}")
        reply: SpawnReply = json.loads(line)
        return reply

    def close(self) -> None:
        """Stop the server (it exits when its stdin closes)."""
        if self._proc is None:
            return
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc.stdout.close()
        self._proc = None


def run_cli(chain: Path, request: SpawnRequest) -> SpawnReply:
    """Run one ``python -m chainrt run|resume ... --json``, killed after ``kill_after`` s."""
    if request["foreign_host"]:
        raise ValueError("foreign hosts need the fork server; the CLI runs as this host")
    run_id = request["run_id"]
    args = [sys.executable, "-m", "chainrt", request["mode"]]
    if request["mode"] == "run":
        args += [str(chain), "--input", json.dumps(request["input"]), "--run-id", run_id]
    else:
        args += [run_id, "--chains", str(chain.parent)]
    args += ["--store", request["store"], "--json"]
    env = {**os.environ, "CHAINRT_LEASE_TTL_S": str(request["lease_ttl_s"])}
    log = Path(request["input"]["log_dir"]) / f"{run_id}.jsonl"
    with open(request["err"], "ab") as err:
        started = time.time()
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env)
        try:
            if request["kill_after"] is not None and request["from_first_step"]:
                # A fresh interpreter's start-up varies by seconds on a loaded machine, far more
                # than the steps take: count from this process's first step instead.
                _wait_first_step(log, proc)
            proc.wait(timeout=request["kill_after"] or HANG_S)
        except subprocess.TimeoutExpired:
            proc.kill()  # not reaped yet: the pid is still this child's
            proc.wait()
    # Killed by the drill, not by the hang guard: a hung process is reported as a failure.
    killed = request["kill_after"] is not None and proc.returncode == -signal.SIGKILL
    code = None if killed else proc.returncode
    return SpawnReply(
        pid=proc.pid, killed=killed, code=code, started_at=started, ended_at=time.time()
    )


def _wait_first_step(log: Path, proc: subprocess.Popen[bytes]) -> None:
    """Return once ``proc`` has logged a step call in ``log`` (or ended, or HANG_S passed)."""
    needle = f'"pid": {proc.pid},'.encode()
    compact = f'"pid":{proc.pid},'.encode()
    deadline = time.monotonic() + HANG_S
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            data = log.read_bytes()
            if needle in data or compact in data:
                return
        time.sleep(0.002)


# ---------------------------------------------------------------------------- inside the server


def _serve(chain: Path) -> None:
    """Fork one runner child per request line on stdin; answer how it ended on stdout."""
    # Imported once here and inherited by every child: that is what makes a child start fast.
    import chainrt._runtime
    import chainrt.concurrency._redis
    import chainrt.store._redis  # noqa: F401
    from chainrt.spec import load_spec, resolve_callable

    loaded = load_spec(chain)
    for step in loaded.spec.steps[:2]:  # executes the tool file here, once, not in every child
        if step.tool is not None:
            resolve_callable(step.tool, chain_dir=loaded.source_dir, allowed_modules=())
    for line in sys.stdin:
        request: SpawnRequest = json.loads(line)
        started = time.time()
        sys.stdout.flush()  # a child must not inherit (and flush again) buffered output
        pid = os.fork()
        if pid == 0:
            _child(request, loaded)
        killed, code = _reap(pid, request["kill_after"])
        reply = SpawnReply(
            pid=pid, killed=killed, code=code, started_at=started, ended_at=time.time()
        )
        print(json.dumps(reply), flush=True)


def _reap(pid: int, kill_after: float | None) -> tuple[bool, int | None]:
    """Wait for child ``pid``, SIGKILL it after ``kill_after`` seconds; (killed, exit code)."""
    fd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([fd], [], [], HANG_S if kill_after is None else kill_after)
        if not ready:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    if kill_after is not None and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        return True, None
    return False, os.waitstatus_to_exitcode(status)  # -9 after the hang guard: a failure


def _child(request: SpawnRequest, loaded: Any) -> NoReturn:
    """A forked runner: run or resume one run; exit 0 (completed), 1 (not), 3 (error)."""
    code = 70
    try:
        err = os.open(request["err"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.dup2(err, 1)
        os.dup2(err, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.environ["CHAINRT_LEASE_TTL_S"] = str(request["lease_ttl_s"])
        code = asyncio.run(_child_run(request, loaded))
    except BaseException as exc:  # the child must never return into the server's loop
        print(f"drill child: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    finally:
        os._exit(code)


async def _child_run(request: SpawnRequest, loaded: Any) -> int:
    from chainrt._runtime import open_runtime

    try:
        async with open_runtime(store=request["store"]) as runtime:
            if request["foreign_host"]:
                # As if on another machine: the dead-pid shortcut cannot apply to this owner.
                runtime.runner.host = f"drill-host-{os.getpid()}"
            if request["mode"] == "run":
                result = await runtime.runner.run(
                    loaded.spec,
                    request["input"],
                    source_dir=loaded.source_dir,
                    run_id=request["run_id"],
                )
            else:
                result = await runtime.runner.resume(request["run_id"])
    except ChainRTError as exc:
        print(f"chainrt: {exc}", file=sys.stderr, flush=True)
        return 3
    print(json.dumps({"run_id": result.run_id, "status": result.status}), flush=True)
    return 0 if result.status == "completed" else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m chainrt.testing._drill_procs CHAIN  (JSON requests on stdin)")
    _serve(Path(sys.argv[1]))
