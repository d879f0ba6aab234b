"""Hot reload of the torch engine: the new engine runs the prompt lengths the serving engine met
lately and its last request before the swap (``TorchEngine.warm_like``), and closing the replaced engine frees its model without a
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

from chainrt.engines import ChatMessage, GenerationRequest

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.slow


def random_model(folder: Path) -> Path:
    """A tiny random Llama saved as an HF folder (the bench's builder)."""
    bench = gpu_oom_bench()
    built: Path = bench.build_random_model(folder, layers=2, hidden=128)
    return built


@pytest.mark.timeout(600)  # torch + transformers imports take a minute on a loaded machine
async def test_warm_like_replays_served_shapes_and_last_request_and_close_needs_no_collection(
    tmp_path: Path,
) -> None:
    from chainrt.engines._torch import TorchEngine

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
        longer = GenerationRequest(
            messages=[ChatMessage("user", "Name a color. Be brief.")], max_tokens=3
        )
        made_longer = (await old.generate(longer)).completion_tokens
        answer = await old.generate(asked)
        assert old.last_request is asked  # shared ThreadedEngine tracking
        # Both prompt lengths served, the last one last, each with the tokens decoded after it.
        lengths = [count for count, _ in old.recent_shapes]
        assert lengths == [old.count_tokens(longer), old.count_tokens(asked)]
        assert [made for _, made in old.recent_shapes] == [made_longer, answer.completion_tokens]
        await new.start()
        ran: list[str] = []
        run_job = new.run_job

        def recording(job: Any) -> Any:
            ran.append(job.kind)
            return run_job(job)

        new.run_job = recording  # type: ignore[method-assign]
        new.faults.arm_oom(1)
        await new.warm_like(old)
        # The served shapes, then the last request twice; all housekeeping: no injected fault,
        # not a "last request", no shape of client traffic.
        assert ran == ["warm-shapes", "warm", "warm"]
        assert new.faults.pending_oom == 1
        assert new.last_request is None
        assert new.recent_shapes == ()
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


def test_recent_shapes_keep_the_latest_distinct_prompt_lengths() -> None:
    from chainrt.engines._torch import WARM_SHAPES, TorchEngine

    engine = TorchEngine(device="cpu")  # nothing loads: the bookkeeping alone
    for length in range(WARM_SHAPES + 2):
        engine._remember_shape(100 + length, 4)
    engine._remember_shape(102, 2)  # seen again: most recent now, keeps the longer decode
    engine._remember_shape(103, 9)
    lengths = [count for count, _ in engine.recent_shapes]
    assert len(lengths) == WARM_SHAPES
    assert lengths[-2:] == [102, 103]
    assert 100 not in lengths  # the oldest went first
    assert 101 not in lengths
    assert dict(engine.recent_shapes)[102] == 4
    assert dict(engine.recent_shapes)[103] == 9
