"""No model is freed while a thread generates with it: not at interpreter exit, not on close or
reload (issue 41: exit 139 after a completed run).

The crash this guards against: ``chainrt run ... --budget 600ms`` cut the local model's generation
off at a step deadline, printed its summary and exited while the daemon model thread was still
inside ``llama_decode``; C-level ``exit()`` then ran the shared libraries' finalizers (ggml's CPU
backend among them) under that thread: SIGSEGV in ``ggml_cpu_extra_compute_forward``, exit 139.
Each case runs in a child process, so that a crash is an exit status here, not a dead pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from chainrt.engines._base import GenerationRequest, StreamDelta
from chainrt.engines._bridge import EngineJob
from chainrt.engines._threaded import ThreadedEngine
from chainrt.errors import WorkerError

ROOT = Path(__file__).resolve().parent.parent
SUPPORT = ROOT / "chains" / "support_agent.yaml"


def _python(code: str, *, timeout: float = 100) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )


EXIT_WHILE_GENERATING = """
    import asyncio, atexit, sys, threading

    def report():  # registered before the engine's own hook, so it runs after it
        print("after-exit-hook", engine.loaded, engine.thread_alive, flush=True)

    atexit.register(report)
    from chainrt.engines import ChatMessage, GenerationRequest, LocalEngine

    engine = LocalEngine()
    inside = threading.Event()

    async def generate():
        request = GenerationRequest(
            messages=[ChatMessage("user", "Write a very long story about a dragon.")],
            max_tokens=1900,
        )
        async for delta in engine.stream(request):
            if delta.text:
                inside.set()

    # The generation's loop runs on a daemon thread that nobody stops: at exit the model
    # thread is in the middle of the answer, as after a cut-off step.
    threading.Thread(target=asyncio.run, args=(generate(),), daemon=True).start()
    if not inside.wait(60):
        sys.exit("no token within 60 s")
    print("exiting mid-generation", flush=True)
    sys.exit(0)
"""


@pytest.mark.parametrize("n", range(3))
def test_exit_in_the_middle_of_a_generation_stops_it_then_frees_the_model(n: int) -> None:
    done = _python(EXIT_WHILE_GENERATING)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "exiting mid-generation" in done.stdout
    # The engine's exit hook ran first: the thread had stopped and the model was freed.
    assert "after-exit-hook False False" in done.stdout


class _SpinEngine(ThreadedEngine):
    """A model thread without a model: a job spins until cancelled (or ``stubborn_s`` passes,
    ignoring the cancel, like one long call into a C library). Tests the thread rules alone."""

    name = "spin"

    def __init__(self, stubborn_s: float = 0.0) -> None:
        super().__init__()
        self.model: object | None = None
        self.stubborn_s = stubborn_s
        self.inside = threading.Event()

    @property
    def loaded(self) -> bool:
        return self.model is not None

    def load_model(self) -> None:
        self.model = object()

    def unload_model(self) -> None:
        self.model = None

    def count_tokens(self, request: GenerationRequest) -> int:
        return 0

    def run_job(self, job: EngineJob) -> StreamDelta | BaseException:
        self.inside.set()
        until = time.monotonic() + self.stubborn_s
        while not job.cancelled.is_set() or time.monotonic() < until:
            time.sleep(0.005)
        return StreamDelta("")


def _busy(engine: _SpinEngine) -> None:
    engine.ensure_loaded()
    engine._jobs.put(EngineJob(0, 0, "generate"))
    assert engine.inside.wait(10)


def test_stop_for_exit_cancels_the_job_then_frees_and_never_loads_again() -> None:
    engine = _SpinEngine()
    _busy(engine)
    assert engine.stop_for_exit(timeout_s=10)
    assert not engine.loaded
    assert not engine.thread_alive
    with pytest.raises(WorkerError, match="exiting"):
        engine.ensure_loaded()


def test_a_thread_that_does_not_stop_in_time_keeps_its_model() -> None:
    engine = _SpinEngine(stubborn_s=1.0)
    _busy(engine)
    assert not engine.stop_for_exit(timeout_s=0.05)
    assert engine.loaded  # never freed under the thread that still runs it
    assert engine._thread is not None
    engine._thread.join(10)  # it ends by itself (the stop job is queued)


def test_a_close_holding_the_load_lock_does_not_hang_exit() -> None:
    engine = _SpinEngine()
    engine.ensure_loaded()
    with engine._load_lock:  # a close under way elsewhere
        assert not engine.stop_for_exit(timeout_s=0.05)
    assert engine.loaded
    assert engine.stop_for_exit(timeout_s=10)
    assert not engine.loaded


CLOSE_AND_RELOAD_WHILE_GENERATING = """
    import asyncio, json
    from chainrt.errors import WorkerError
    from chainrt.engines import ChatMessage, GenerationRequest, LocalEngine

    STORY = [ChatMessage("user", "Write a very long story about a dragon and a knight.")]
    engine = LocalEngine()
    outcomes = []

    async def generate_until(free):
        pieces = 0
        try:
            async for delta in engine.stream(GenerationRequest(messages=STORY, max_tokens=1500)):
                if delta.text:
                    pieces += 1
                    if pieces == 3:  # the model thread is inside llama_decode now
                        asyncio.get_running_loop().call_soon(free)
                if delta.result is not None:
                    return f"result:{delta.result.finish_reason}:{delta.result.completion_tokens}"
        except WorkerError as exc:
            return f"error:{type(exc).__name__}"
        return "no-result"

    async def main():
        for round in range(2):
            # close(): the worker shutting down, or a reload's old engine closing.
            closing = []
            outcomes.append(await generate_until(lambda: closing.append(
                asyncio.ensure_future(engine.close()))))
            await asyncio.gather(*closing)
            assert not engine.loaded
            # reload(): a dead engine's recovery (stop, free, load) from another thread.
            reloading = []
            outcomes.append(await generate_until(lambda: reloading.append(
                asyncio.ensure_future(asyncio.to_thread(engine.reload)))))
            await asyncio.gather(*reloading)
            again = await engine.generate(GenerationRequest(
                messages=[ChatMessage("user", "Say OK")], max_tokens=2))
            outcomes.append(f"after-reload:{again.completion_tokens}")
        await engine.close()
        print(json.dumps(outcomes))

    asyncio.run(main())
"""


def test_close_and_reload_while_generating_stop_the_generation_first() -> None:
    done = _python(CLOSE_AND_RELOAD_WHILE_GENERATING)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    outcomes = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(outcomes) == 6
    for cut in (outcomes[0], outcomes[1], outcomes[3], outcomes[4]):
        # Stopped at its next token (an aborted result) or failed as closed: never 1500 tokens.
        kind, _, rest = cut.partition(":")
        assert kind in ("result", "error"), cut
        if kind == "result":
            reason, _, tokens = rest.partition(":")
            assert reason == "abort", cut
            assert int(tokens) < 1500, cut
    assert outcomes[2] == outcomes[5] == "after-reload:2"


def _support_run(tmp_path: Path, n: int) -> subprocess.CompletedProcess[str]:
    question = {"user_id": "u1", "session_id": f"s{n}", "question": "Where is my order 1042?"}
    env = {**os.environ, "SUPPORT_MEMORY_FILE": str(tmp_path / "memory.jsonl")}
    env.pop("CHAINRT_POOL", None)
    return subprocess.run(
        [sys.executable, "-m", "chainrt", "run", str(SUPPORT), "--budget", "600ms",
         "--store", f"sqlite:///{tmp_path}/runs.db", "--input", json.dumps(question)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=100, check=False,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("n", range(50))
def test_a_cut_off_support_run_exits_0(tmp_path: Path, n: int) -> None:
    """The issue's command, 50 times: it crashed 5 of 8 times here before the fix (and 6 of 8,
    3 of 8 on the reporters' machines). One run per test keeps each within the test timeout on
    a loaded machine; the budget is the point (the generation must be cut off)."""
    done = _support_run(tmp_path, n)
    assert done.returncode == 0, (done.returncode, done.stdout[-1000:], done.stderr[-2000:])
    assert done.stdout.startswith(("COMPLETED", "PARTIAL")), done.stdout[-1000:]
