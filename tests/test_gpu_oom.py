"""A real CUDA out-of-memory error fails only its own request; the engine serves again in process.

Runs the episodes of ``bench/gpu_oom.py`` (random-weights Llama, GPU filled with ballast, one
request that cannot fit, small requests around it) and checks the properties, not the speed:
the speed is what the bench prints. Skipped without a CUDA GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
from types import ModuleType

import pytest
from bench_loader import gpu_oom_bench

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def load_bench() -> ModuleType:
    module = gpu_oom_bench()
    return module


def test_real_cuda_oom_fails_one_request_and_the_engine_recovers_in_process() -> None:
    bench = load_bench()
    pid = os.getpid()
    args = argparse.Namespace(
        model=None,
        random_model=True,
        episodes=3,
        concurrency=4,
        margin_mb=256,
        max_model_len=65536,
        dry_run=False,
        json=None,
    )
    report = asyncio.run(bench.run(args))
    assert report.ballast_gib > 1  # the GPU really was filled
    assert report.free_after_ballast_mb < 1024
    for episode in report.episodes:
        assert episode.oom_caught, episode.error
        assert "OutOfMemoryError" in episode.error  # torch's own CUDA error, not an injected one
        assert "injected" not in episode.error
        assert episode.small_failed == 0  # concurrent small requests all succeeded
        assert episode.small_ok > 0
        assert math.isfinite(episode.recovery_s)  # recover() returned: ready again
        # What the failed request allocated was given back: no creeping leak per episode.
        assert abs(episode.allocated_delta_mb) < 64
    assert os.getpid() == pid  # recovered in this process
