"""Loading beside a serving engine (hot reload) runs at the lowest CPU priority, and only there.

Linux only: a niceness set on a thread id applies to that thread. The first tests use a small
ThreadedEngine whose "model" is a Python object (what is checked is the threading, not a model);
the last one loads the real llama.cpp engine with two threads and checks that no thread of the
process is left niced once it serves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from workers.engines import ChatMessage, GenerationRequest
from workers.engines._base import GenerationResult, StreamDelta
from workers.engines._bridge import EngineJob
from workers.engines._threaded import LOWEST_NICE, ThreadedEngine, run_low_priority

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="per-thread niceness is a Linux feature"
)


def nice_of(native_id: int) -> int:
    """The niceness of one thread of this process."""
    return os.getpriority(os.PRIO_PROCESS, native_id)


def niced_threads() -> list[str]:
    """Threads of this process whose niceness differs from the main thread's."""
    base = nice_of(threading.main_thread().native_id or os.getpid())
    found = []
    for task in Path("/proc/self/task").iterdir():
        try:
            nice = nice_of(int(task.name))
            name = (task / "comm").read_text().strip()
        except (OSError, ProcessLookupError):
            continue  # ended meanwhile
        if nice != base:
            found.append(f"{name} (tid {task.name}, nice {nice})")
    return found


def settled_niced_threads() -> list[str]:
    """niced_threads() once exiting threads are gone: Thread.join returns a moment before the
    OS thread has left /proc/self/task, so a just-joined loader may still be listed. Polled for
    up to 10 s, far beyond that moment even on a loaded machine; a thread that stays is a bug."""
    deadline = time.monotonic() + 10
    found = niced_threads()
    while found and time.monotonic() < deadline:
        time.sleep(0.01)
        found = niced_threads()
    return found


class RecordingEngine(ThreadedEngine):
    """Records the niceness and thread of its load and of the jobs it runs."""

    name = "recording"
    thread_name = "chainrt-recording"

    def __init__(self, *, low_priority: bool) -> None:
        super().__init__()
        self.low_priority_load = low_priority
        self.model: object | None = None
        self.load_seen: tuple[str, int] | None = None
        self.job_seen: tuple[str, int] | None = None

    @property
    def loaded(self) -> bool:
        return self.model is not None

    def load_model(self) -> None:
        me = threading.current_thread()
        self.load_seen = (me.name, nice_of(threading.get_native_id()))
        self.model = object()

    def unload_model(self) -> None:
        self.model = None

    def run_job(self, job: EngineJob) -> StreamDelta:
        self.job_seen = (threading.current_thread().name, nice_of(threading.get_native_id()))
        return StreamDelta("", GenerationResult("ok", "stop", 1, 1))

    def count_tokens(self, request: GenerationRequest) -> int:
        return 1


def ask() -> GenerationRequest:
    return GenerationRequest(messages=[ChatMessage("user", "Say OK")], max_tokens=2)


async def test_start_beside_loads_niced_and_serves_at_normal_priority() -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    engine = RecordingEngine(low_priority=True)
    try:
        await engine.start_beside()
        assert engine.load_seen == ("chainrt-recording-loader", LOWEST_NICE)
        assert engine.thread_alive
        assert (await engine.generate(ask())).text == "ok"
        assert engine.job_seen == ("chainrt-recording", base)
        assert settled_niced_threads() == []  # the loader ended; nothing else was niced
        await engine.start_beside()  # idempotent: no second load
        assert engine.load_seen[0] == "chainrt-recording-loader"
    finally:
        await engine.close()


async def test_plain_start_and_engines_without_the_flag_load_at_normal_priority() -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    for engine, start in (
        (RecordingEngine(low_priority=True), "start"),
        (RecordingEngine(low_priority=False), "start_beside"),
    ):
        try:
            await getattr(engine, start)()
            assert engine.load_seen is not None
            assert engine.load_seen[1] == base
            assert (await engine.generate(ask())).text == "ok"
        finally:
            await engine.close()


async def test_a_failed_niced_load_raises_in_the_caller() -> None:
    def fail() -> None:
        raise RuntimeError("no such model")

    with pytest.raises(RuntimeError, match="no such model"):
        await run_low_priority(fail, "chainrt-test-loader")
    assert settled_niced_threads() == []


_FRESH_PROCESS = """
import asyncio, json, sys
from tests.test_engine_load_priority import ask, settled_niced_threads
from workers.engines import LocalEngine

async def main() -> list[str]:
    assert "llama_cpp" not in sys.modules and "numpy" not in sys.modules
    engine = LocalEngine(n_threads=2)
    seen = []
    try:
        await engine.start_beside()
        for _ in range(2):
            assert (await engine.generate(ask())).completion_tokens >= 1
            seen += settled_niced_threads()
    finally:
        await engine.close()
    return seen

print(json.dumps(asyncio.run(main())))
"""


@pytest.mark.slow
def test_llamacpp_loaded_beside_leaves_no_thread_niced() -> None:
    """The real llama.cpp engine with two threads, in a fresh interpreter (nothing imported yet):
    the libraries' own threads (numpy's OpenBLAS at import, llama.cpp's OpenMP workers at the
    first generation) are started at normal priority, never by the niced loader."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS],
        cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


@pytest.mark.slow
async def test_a_reloaded_local_engine_is_warmed_with_the_serving_engines_last_prompt() -> None:
    """warm_like: the new engine's prompt cache holds what the old one's holds, so the first
    request after the swap reuses the prefix as it would have on the old engine."""
    from workers.engines import LocalEngine

    asked = GenerationRequest(
        messages=[
            ChatMessage("system", "You answer with one word, lower case, no punctuation."),
            ChatMessage("user", "Name a color."),
        ],
        max_tokens=3,
        temperature=0.0,
    )
    old, new = LocalEngine(), LocalEngine()
    try:
        await old.generate(asked)
        await new.start_beside()
        await new.generate(ask())  # the reload's readiness probe: another prompt in the cache
        await new.warm_like(old)
        model = new._model
        assert model is not None
        prompt = model.prompt_tokens(asked)
        assert list(model._llm._input_ids) == prompt[:-1]  # all but the last, as _prefill keeps
        assert (await new.generate(asked)).text == (await old.generate(asked)).text
        await new.warm_like(new)  # an engine that served nothing else: the same prompt again
        await LocalEngine().warm_like(new)  # a fresh, unloaded engine loads and warms
    finally:
        await old.close()
        await new.close()
