"""Building, checking and measuring one vLLM engine core (an ``AsyncLLM``), for
:mod:`chainrt.engines._vllm`.

The engine keeps the request path and the recovery policy; how one ``AsyncLLM`` is configured and
started, how it is checked with a one-token generation and how its KV memory is read from vLLM's
block accounting live here, shared by the serving core and the standby core alike.
"""

from __future__ import annotations

import asyncio
import os
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import EngineDead, WorkerError
from ._base import MemoryStats
from ._hf_model import ModelFacts
from ._vllm_support import DTYPE_BYTES, KvUsage, remember_processes

__all__ = [
    "CPU_KV_CACHE_BYTES",
    "PROBE_TIMEOUT_S",
    "CoreConfig",
    "kv_memory",
    "probe_llm",
    "warm_llm",
]

CPU_KV_CACHE_BYTES = 512 * 2**20
"""KV cache of the CPU build unless ``VLLM_CPU_KVCACHE_SPACE`` (GiB) says otherwise: ~23k tokens
of SmolLM2 in bf16, about 11 full 2048-token contexts, without taking the host's memory."""
PROBE_TIMEOUT_S = 60.0
"""How long a health probe (one token) may take before the core counts as broken."""


@dataclass
class CoreConfig:
    """How every engine core of one :class:`~chainrt.engines._vllm.VllmEngine` is built."""

    model_name: str
    max_model_len: int
    max_num_seqs: int
    dtype: str
    enforce_eager: bool
    kv_cache_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    extra_args: dict[str, Any] = field(default_factory=dict)

    def engine_kwargs(self, model_dir: Path, is_cpu: bool) -> dict[str, Any]:
        """The ``AsyncEngineArgs`` keyword arguments for a core serving ``model_dir``."""
        kwargs: dict[str, Any] = {
            "model": str(model_dir),
            "served_model_name": self.model_name,
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "enforce_eager": self.enforce_eager,
            "scheduling_policy": "priority",
            "disable_log_stats": True,  # our KV-usage logger still gets the scheduler stats
            "seed": 0,
        }
        kv_bytes = self.kv_cache_bytes
        if kv_bytes is None and is_cpu and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            kv_bytes = CPU_KV_CACHE_BYTES
        if kv_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = kv_bytes
        if self.gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization
        kwargs.update(self.extra_args)
        return kwargs

    def start_llm(self, v: dict[str, Any], model_dir: Path, kv: KvUsage) -> Any:
        """Start a new AsyncLLM (blocking; ``v``: :func:`import_vllm`'s names); returns it."""
        kwargs = self.engine_kwargs(model_dir, bool(v["is_cpu"]))
        try:
            args = v["AsyncEngineArgs"](**kwargs)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                warnings.simplefilter("ignore", FutureWarning)
                llm = v["AsyncLLM"].from_engine_args(
                    args, stat_loggers=[kv.factory(v["StatLoggerBase"])]
                )
        except Exception as exc:  # vLLM raises RuntimeError/ValueError/... on a failed start
            raise WorkerError(
                f"cannot start vLLM on {model_dir} ({type(exc).__name__}: {exc}); see the "
                "engine core's log above for the cause"
            ) from exc
        remember_processes(llm)  # its children outlive a killed core: shutdown_llm ends them
        return llm


async def probe_llm(v: dict[str, Any], llm: Any, prompt_ids: list[int]) -> None:
    """One short deterministic generation straight on ``llm``; raises if it fails."""
    params = v["SamplingParams"](max_tokens=1, temperature=0.0)
    if await asyncio.wait_for(_run(llm, prompt_ids, params, "probe"), PROBE_TIMEOUT_S) < 1:
        raise EngineDead("the vLLM engine produced no token for its health probe")


async def warm_llm(llm: Any, prompts: list[list[int]], params: Any) -> None:
    """Do on a new engine core the first-time work of the serving path, before it serves.

    A core compiles part of its sampler the first time it is asked for log-probabilities: vLLM's
    ``batched_count_greater_than`` (token ranks) is ``torch.compile``d with inductor, once for a
    batch of one and once more, with dynamic shapes, for the first batch of another size. That is
    2.6 s on two CPU cores with inductor's on-disk cache warm (14.6 s cold), paid by the first
    requests after a swap unless paid here. So: the first prompt alone, then all of them at once,
    each with ``params`` (the serving path's sampling parameters: log-probabilities, a decode step).
    Raises when a generation fails or produces nothing.
    """

    async def both() -> list[int]:
        alone = await _run(llm, prompts[0], params, "warm")
        together = await asyncio.gather(*(_run(llm, ids, params, "warm") for ids in prompts))
        return [alone, *together]

    if min(await asyncio.wait_for(both(), PROBE_TIMEOUT_S)) < 1:
        raise EngineDead("the vLLM engine produced no token while warming up")


async def _run(llm: Any, prompt_ids: list[int], params: Any, prefix: str) -> int:
    """Generate on ``llm`` at the highest priority; how many tokens came out."""
    rid = f"{prefix}-{uuid.uuid4().hex[:12]}"
    produced = 0
    async for out in llm.generate({"prompt_token_ids": prompt_ids}, params, rid, priority=-1):
        produced += len(out.outputs[0].token_ids)
    return produced


def kv_memory(
    llm: Any, facts: ModelFacts, dtype: str, kv: KvUsage, max_model_len: int
) -> MemoryStats:
    """KV memory from vLLM's own block accounting: blocks × block size × bytes per token.

    ``free_bytes`` uses the engine core's last reported KV usage (0 when nothing runs).
    """
    per_token = facts.kv_bytes_per_token(DTYPE_BYTES[dtype])
    cache = llm.vllm_config.cache_config
    blocks = int(cache.num_gpu_blocks or 0)
    total = blocks * int(cache.block_size) * per_token
    # vLLM reports usage only when it steps; with nothing unfinished the cache is free.
    usage = kv.usage if llm.get_num_unfinished_requests() else 0.0
    return MemoryStats(
        total_bytes=total,
        free_bytes=int(total * (1.0 - usage)),
        kv_bytes_per_token=per_token,
        extra={
            "kv_blocks": float(blocks),
            "block_size": float(cache.block_size),
            "kv_usage": usage,
            "running": float(kv.running),
            "waiting": float(kv.waiting),
            "context_tokens": float(max_model_len),
        },
    )
