"""The ``torch`` engine and the HF model cache, on real SmolLM2 weights (CPU here, CUDA if present).

The CPU tests run in CI; the CUDA ones carry the ``gpu`` marker and skip without a GPU. The real
CUDA out-of-memory episode lives in ``tests/test_gpu_oom.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench_loader import gpu_oom_bench

from chainrt._errors import EngineOOM, WorkerError
from chainrt.engines._base import (
    ChatMessage,
    ContextLengthExceeded,
    GenerationRequest,
    GenerationResult,
)
from chainrt.engines._hf_cache import (
    MARKER_FILE,
    default_model_dir,
    ensure_hf_model,
    find_smollm2_gguf,
    is_complete,
)
from chainrt.engines._hf_model import ModelFacts, read_model_facts
from chainrt.engines._torch import TorchEngine

# Real model conversion and generations on the CPU (about two minutes on 2 cores): the slow tier.
pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")

# SmolLM2-135M: 30 layers, 3 KV heads of 64 dims.
SMOL_KV_ELEMENTS_PER_TOKEN = 2 * 30 * 3 * 64


@pytest.fixture(scope="module")
def engine() -> Iterator[TorchEngine]:
    """SmolLM2 on the CPU, loaded once for the module."""
    eng = TorchEngine(device="cpu")
    asyncio.run(eng.start())
    yield eng
    asyncio.run(eng.close())


def chat(text: str, **kw: object) -> GenerationRequest:
    return GenerationRequest(messages=[ChatMessage("user", text)], **kw)  # type: ignore[arg-type]


async def first_piece(engine: TorchEngine, request: GenerationRequest) -> asyncio.Task[None]:
    """Start ``request`` and return once its first token arrived (so it is running now)."""
    started = asyncio.Event()

    async def consume() -> None:
        async for delta in engine.stream(request):
            if delta.text:
                started.set()
        started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    return task


# -- the engine on CPU ---------------------------------------------------------------------


async def test_chat_generation_is_real_text(engine: TorchEngine) -> None:
    result = await engine.generate(chat("What is the capital of France?", max_tokens=16))
    assert result.finish_reason == "stop"
    assert "Paris" in result.text
    assert "<|im_" not in result.text
    assert result.prompt_tokens == engine.count_tokens(chat("What is the capital of France?"))
    assert 0 < result.completion_tokens <= 16
    # Confidence from the model's own logits, and the prefill/decode split (workers.md).
    assert result.confidence is not None
    assert 0.0 < result.confidence <= 1.0
    assert result.prefill_ms is not None
    assert result.prefill_ms > 0.0
    assert result.decode_ms is not None
    assert result.decode_ms >= 0.0


async def test_stream_pieces_add_up_to_the_result(engine: TorchEngine) -> None:
    pieces: list[str] = []
    final: GenerationResult | None = None
    async for delta in engine.stream(GenerationRequest(prompt="Once upon a time", max_tokens=12)):
        pieces.append(delta.text)
        final = delta.result or final
    assert final is not None
    assert final.finish_reason == "length"
    assert final.completion_tokens == 12
    assert len([p for p in pieces if p]) > 1
    assert "".join(pieces) == final.text


async def test_stop_string_ends_the_answer_and_is_not_emitted(engine: TorchEngine) -> None:
    result = await engine.generate(
        GenerationRequest(prompt="1, 2, 3, 4, 5, 6,", max_tokens=16, stop=[" 9"])
    )
    assert result.finish_reason == "stop"
    assert result.text.strip().startswith("7, 8")
    assert "9" not in result.text


async def test_deadline_returns_partial_text(engine: TorchEngine) -> None:
    request = GenerationRequest(
        prompt="Count from one to a thousand:", max_tokens=1000, deadline=time.time() + 0.6
    )
    result = await engine.generate(request)
    assert result.finish_reason == "deadline"
    assert result.completion_tokens < 1000


async def test_past_deadline_generates_nothing(engine: TorchEngine) -> None:
    result = await engine.generate(chat("Hi", deadline=time.time() - 1))
    assert (result.finish_reason, result.completion_tokens, result.text) == ("deadline", 0, "")


async def test_critical_runs_before_queued_low_priority(engine: TorchEngine) -> None:
    done: list[str] = []

    async def run(tag: str, priority: int) -> None:
        await engine.generate(GenerationRequest(prompt=tag, max_tokens=3, priority=priority))
        done.append(tag)

    busy = await first_piece(engine, GenerationRequest(prompt="Busy:", max_tokens=12))
    lows = [asyncio.create_task(run(f"low {i}", 3)) for i in range(3)]
    await asyncio.sleep(0.05)  # the lows are queued behind the busy request
    await asyncio.gather(run("critical", 0), *lows, busy)
    assert done[0] == "critical"


async def test_oom_fails_only_its_own_request_and_recover_serves_again(
    engine: TorchEngine,
) -> None:
    events = engine.oom_events
    running = await first_piece(engine, GenerationRequest(prompt="Running:", max_tokens=10))
    # The next generation the GPU thread starts hits an out-of-memory error (raised as
    # torch.OutOfMemoryError at the forward pass, caught by the real OOM branch).
    engine.faults.arm_oom(1)
    victim = asyncio.create_task(engine.generate(GenerationRequest(prompt="A", max_tokens=3)))
    await asyncio.sleep(0.05)
    bystander = asyncio.create_task(engine.generate(GenerationRequest(prompt="B", max_tokens=3)))
    with pytest.raises(EngineOOM) as info:
        await victim
    assert info.value.retryable
    assert info.value.__cause__ is None  # no reference to the torch error and its tensors
    await running  # started before: unaffected
    assert (await bystander).completion_tokens == 3  # queued after: unaffected
    assert engine.oom_events == events + 1
    assert engine.last_oom_error is not None
    assert "OutOfMemoryError" in engine.last_oom_error
    await engine.recover()
    assert (await engine.generate(chat("Say hi.", max_tokens=4))).completion_tokens > 0


async def test_recover_reloads_a_closed_engine_in_process() -> None:
    eng = TorchEngine(device="cpu")
    await eng.start()
    await eng.close()
    await eng.recover()
    try:
        result = await eng.generate(GenerationRequest(prompt="Hello", max_tokens=2))
        assert result.completion_tokens == 2
    finally:
        await eng.close()


async def test_memory_reports_host_memory_and_kv_size(engine: TorchEngine) -> None:
    stats = engine.memory()
    assert stats is not None
    assert 0 < stats.free_bytes <= stats.total_bytes
    assert stats.kv_bytes_per_token == SMOL_KV_ELEMENTS_PER_TOKEN * 4  # float32 on CPU
    assert stats.extra["context_tokens"] == engine.context_tokens == 2048


async def test_bad_requests_get_clear_errors(engine: TorchEngine) -> None:
    with pytest.raises(ContextLengthExceeded) as too_long:
        await engine.generate(GenerationRequest(prompt="word " * 2100, max_tokens=2))
    assert too_long.value.prompt_tokens >= 2048
    bad_schema = {"type": "object", "properties": {"x": {"type": "string", "pattern": "(open"}}}
    with pytest.raises(WorkerError, match="JSON Schema") as json_req:
        await engine.generate(chat("Hi", json_output=True, json_schema=bad_schema))
    assert not json_req.value.retryable
    with pytest.raises(WorkerError, match="messages or a prompt"):
        await engine.generate(GenerationRequest())


# -- the HF model cache --------------------------------------------------------------------


def test_cached_model_directory_is_complete_and_described() -> None:
    path = ensure_hf_model()
    assert path == default_model_dir()
    assert is_complete(path)
    marker = json.loads((path / MARKER_FILE).read_text())
    assert marker["source"] == find_smollm2_gguf().name
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config  # a plain dense model, no GGUF quantizer
    facts = read_model_facts(path)
    assert facts == ModelFacts(
        num_layers=30, num_kv_heads=3, head_dim=64, max_position_embeddings=8192
    )
    assert facts.kv_bytes_per_token(2) == SMOL_KV_ELEMENTS_PER_TOKEN * 2


def test_model_facts_reject_unusable_configs(tmp_path: Path) -> None:
    with pytest.raises(WorkerError, match="num_hidden_layers"):
        ModelFacts.from_config({"num_attention_heads": 4, "hidden_size": 64})
    with pytest.raises(WorkerError, match="head_dim"):
        ModelFacts.from_config(
            {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "head_dim": -1}
        )
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(WorkerError, match="not a JSON object"):
        read_model_facts(tmp_path)
    with pytest.raises(WorkerError, match="cannot read"):
        read_model_facts(tmp_path / "missing")


def test_missing_gguf_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(WorkerError, match="does not exist"):
        ensure_hf_model(tmp_path / "model", gguf_path=tmp_path / "nope.gguf")
    assert not (tmp_path / "model").exists()


@pytest.mark.slow
@pytest.mark.timeout(400)  # imports of torch + transformers alone take a minute on a loaded machine
def test_killed_conversion_leaves_no_half_cache(tmp_path: Path) -> None:
    target = tmp_path / "models" / "smol"
    code = "import sys; from chainrt.engines._hf_cache import ensure_hf_model; ensure_hf_model(sys.argv[1])"
    proc = subprocess.Popen([sys.executable, "-c", code, str(target)], env=os.environ.copy())
    try:
        stop = time.monotonic() + 240  # a wait, not a measurement: the kill must come mid-way
        while not list(target.parent.glob(".smol.tmp-*")) and time.monotonic() < stop:
            assert proc.poll() is None, "the conversion ended before it wrote anything"
            time.sleep(0.02)
        assert list(target.parent.glob(".smol.tmp-*")), "the conversion never started writing"
        proc.kill()  # mid-conversion: the temporary directory exists, the target does not
    finally:
        proc.wait()
    assert not target.exists()
    assert list(target.parent.glob(".smol.tmp-*"))  # the killed one's leftovers
    assert ensure_hf_model(target) == target
    assert is_complete(target)
    assert not list(target.parent.glob(".smol.tmp-*"))  # cleaned up by the next conversion


# -- CUDA ----------------------------------------------------------------------------------


def cuda_model(tmp_path: Path) -> tuple[Path, int]:
    """SmolLM2 where it is installed, else bench/gpu_oom.py's random Llama (a bare GPU host);
    returns the directory and its KV bytes per token in bfloat16."""
    try:
        return ensure_hf_model(), SMOL_KV_ELEMENTS_PER_TOKEN * 2
    except WorkerError:
        bench = gpu_oom_bench()
        folder: Path = bench.build_random_model(tmp_path / "random-llama")
        return folder, 2 * 8 * 4 * 128 * 2  # 8 layers, 4 KV heads of 128 dims


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
async def test_cuda_engine_generates_and_reports_device_memory(tmp_path: Path) -> None:
    model_dir, kv_per_token = cuda_model(tmp_path)
    eng = TorchEngine(model_dir, device="cuda")
    await eng.start()
    try:
        result = await eng.generate(chat("What is the capital of France?", max_tokens=16))
        assert result.completion_tokens > 0
        assert eng.device == "cuda"
        stats = eng.memory()
        assert stats is not None
        free, total = torch.cuda.mem_get_info()
        assert stats.total_bytes == total
        assert free <= stats.free_bytes <= total  # + torch's cached, unused blocks
        assert stats.kv_bytes_per_token == kv_per_token  # bfloat16 on CUDA
        assert stats.extra["reserved_bytes"] > 0  # the model's weights live on the GPU
    finally:
        await eng.close()
