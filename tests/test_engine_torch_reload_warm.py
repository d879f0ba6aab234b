"""Hot reload of the torch engine: the new engine runs the serving engine's last request before
the swap (``TorchEngine.warm_like``), and closing the replaced engine frees its model without a
full garbage collection (which held the GIL ~0.23 s and stalled the new engine on the H200).

A random-weights Llama (``bench/gpu_oom.py``) on the CPU; CUDA is not needed for these properties.
"""

from __future__ import annotations

import gc
import shutil
import weakref
from pathlib import Path
from typing import Any

import pytest
from bench_loader import gpu_oom_bench

from workers.engines import ChatMessage, GenerationRequest

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.slow


def random_model(folder: Path) -> Path:
    """A tiny random Llama saved as an HF folder (the bench's builder)."""
    bench = gpu_oom_bench()
    built: Path = bench.build_random_model(folder, layers=2, hidden=128)
    return built


@pytest.mark.timeout(600)  # torch + transformers imports take a minute on a loaded machine
async def test_warm_like_replays_the_last_request_and_close_needs_no_full_collection(
    tmp_path: Path,
) -> None:
    from workers.engines._torch import TorchEngine

    first = random_model(tmp_path / "v1")
    shutil.copytree(first, tmp_path / "v2")
    asked = GenerationRequest(
        messages=[ChatMessage("user", "Name a color.")], max_tokens=4, temperature=0.0
    )
    old = TorchEngine(first, model_name="v1", device="cpu", max_model_len=256)
    new = TorchEngine(tmp_path / "v2", model_name="v2", device="cpu", max_model_len=256)
    fresh = TorchEngine(first, model_name="v3", device="cpu", max_model_len=256)
    try:
        await new.warm_like(old)  # the old engine served nothing yet: nothing to replay
        assert not new.loaded
        answer = await old.generate(asked)
        assert old.last_request is asked  # shared ThreadedEngine tracking
        await new.start()
        new.faults.arm_oom(1)
        await new.warm_like(old)
        # The warm-up generations are housekeeping: no injected fault, not a "last request".
        assert new.faults.pending_oom == 1
        assert new.last_request is None
        new.faults.reset()
        assert (await new.generate(asked)).text == answer.text  # the same weights
        await fresh.warm_like(new)  # an engine not started yet loads, then warms
        assert fresh.loaded
        model: Any = old._model
        freed = weakref.ref(model)
        del model
        gc.disable()  # only an explicit collection can count below
        try:
            full_before = gc.get_stats()[2]["collections"]
            await old.close()
            full_after = gc.get_stats()[2]["collections"]
        finally:
            gc.enable()
        assert freed() is None  # refcounting freed the model
        assert full_after == full_before  # without gc.collect()
    finally:
        for engine in (old, new, fresh):
            await engine.close()
