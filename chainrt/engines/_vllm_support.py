"""vLLM plumbing for :mod:`chainrt.engines._vllm`: its import, KV-usage feed, shutdown, errors.

Kept apart from the engine so that the engine reads as the request and recovery logic alone.
Everything here touches vLLM internals that may move between vLLM releases (checked on 0.32).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import EngineDead, EngineOOM, WorkerError
from ._base import FinishReason, GenerationRequest, GenerationResult
from ._confidence import TOP_K, confidence_score
from ._hf_cache import force_offline

__all__ = [
    "DTYPE_BYTES",
    "Collected",
    "CoreFailedElsewhere",
    "CoreKilled",
    "KvUsage",
    "core_pid",
    "core_signal",
    "end_leftovers",
    "finish_reason",
    "import_vllm",
    "is_oom",
    "raise_native_oom",
    "remember_processes",
    "sampling_params",
    "shutdown_llm",
    "token_top_logprobs",
    "translate_error",
]

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
"""Bytes per element of the dtypes the engine accepts (the KV cache uses the model's dtype)."""
_log = logging.getLogger(__name__)

_SHUTDOWN_TIMEOUT_S = 5.0
_PROCESSES = "_chainrt_core_processes"
"""Attribute of an AsyncLLM holding its engine core's process tree (psutil), noted at build."""


def import_vllm() -> dict[str, Any]:
    """Import what we use of vLLM, once; returns the names.

    vLLM and torch emit Deprecation/FutureWarnings while importing; they are not ours and must
    not kill a worker (or a test run) that treats warnings as errors.
    """
    force_offline()
    # Telemetry would try to reach the network; the worker runs offline.
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        from vllm import AsyncEngineArgs, SamplingParams
        from vllm.platforms import current_platform
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError
        from vllm.v1.metrics.loggers import StatLoggerBase
    return {
        "AsyncEngineArgs": AsyncEngineArgs,
        "AsyncLLM": AsyncLLM,
        "EngineDeadError": EngineDeadError,
        "EngineGenerateError": EngineGenerateError,
        "RequestOutputKind": RequestOutputKind,
        "SamplingParams": SamplingParams,
        "StatLoggerBase": StatLoggerBase,
        "StructuredOutputsParams": StructuredOutputsParams,
        "is_cpu": bool(current_platform.is_cpu()),
    }


class CoreKilled(EngineDead):
    """The engine core died under a request because a signal ended it (SIGKILL, say): from
    outside, not from anything a request made it do. A core that fails inside (an out-of-memory
    error in the model runner, a crashed kernel) exits by itself instead, and then the request it
    was running may be the cause: that death is a plain ``EngineDead`` (never replayed) or, for a
    request taken for a bystander, :class:`CoreFailedElsewhere`."""


class CoreFailedElsewhere(EngineDead):
    """The engine core failed by itself (an out-of-memory error in its model runner, say) while
    this request was taken for a bystander of the failure (:mod:`chainrt.engines._vllm_blame`):
    past its prefill there, or with a smaller new prompt than another request's. Replayed once,
    like :class:`CoreKilled`; the suspect (the largest new prompt) is a plain ``EngineDead``."""


class KvUsage:
    """The engine core's latest KV-cache figures, fed by a vLLM stat logger (any thread)."""

    def __init__(self) -> None:
        self.usage = 0.0
        self.running = 0
        self.waiting = 0

    def factory(self, base: type) -> Callable[[Any, int], Any]:
        """A vLLM ``StatLoggerFactory`` whose loggers write into this object."""
        sink = self

        class KvUsageLogger(base):  # type: ignore[misc]
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                self.engine_index = engine_index

            def record(
                self,
                scheduler_stats: Any,
                iteration_stats: Any,
                mm_cache_stats: Any = None,
                engine_idx: int = 0,
            ) -> None:
                if scheduler_stats is not None:
                    sink.usage = float(scheduler_stats.kv_cache_usage)
                    sink.running = int(scheduler_stats.num_running_reqs)
                    sink.waiting = int(scheduler_stats.num_waiting_reqs)

            def log_engine_initialized(self) -> None:
                return None

        return KvUsageLogger


async def shutdown_llm(llm: Any) -> None:
    """Stop an AsyncLLM and its engine core quietly, release its ZeroMQ context, collect it.

    A dead engine core's children (``VLLM::Worker``) are killed first: left alone they live on
    for seconds after their parent's death and take the CPU the next core needs.
    """
    if llm.errored:
        end_leftovers(llm)
    handler = getattr(llm, "output_handler", None)
    if handler is not None:
        # Stopped first, or it reports the engine core we are about to stop as an error.
        handler.cancel()
    began = time.monotonic()
    await asyncio.to_thread(_stop, llm)
    del llm
    stopped = time.monotonic()
    # The AsyncLLM sits in reference cycles: collected at interpreter exit its __del__ fails
    # noisily (vLLM's module globals are gone by then), so collect it while they exist.
    gc.collect()
    _log.info(
        "vLLM engine core shut down in %.2f s (gc.collect on the event loop %.2f s)",
        time.monotonic() - began, time.monotonic() - stopped,
    )  # fmt: skip


def core_pid(llm: Any) -> int | None:
    """The process id of ``llm``'s engine core process (None when vLLM does not say)."""
    manager = getattr(getattr(llm.engine_core, "resources", None), "engine_manager", None)
    processes = getattr(manager, "processes", None) or []
    pid = getattr(processes[0], "pid", None) if processes else None
    return int(pid) if pid is not None else None


def core_signal(llm: Any) -> int | None:
    """The signal that ended ``llm``'s engine core process; None while it runs, when it exited
    by itself (vLLM ends a core that failed inside, e.g. out of memory, with an exit code) or
    when vLLM does not say."""
    manager = getattr(getattr(llm.engine_core, "resources", None), "engine_manager", None)
    processes = getattr(manager, "processes", None) or []
    try:
        code = processes[0].exitcode if processes else None
    except Exception:  # a process object vLLM closed already
        return None
    return -int(code) if code is not None and code < 0 else None


def remember_processes(llm: Any) -> None:
    """Note ``llm``'s engine core process and its descendants now, while the core lives.

    Once the core dies its children are re-parented and cannot be found from it any more.
    """
    pid = core_pid(llm)
    if pid is None:
        return
    try:
        import psutil

        core = psutil.Process(pid)
        setattr(llm, _PROCESSES, [core, *core.children(recursive=True)])
    except Exception:  # psutil missing, or the core already gone: nothing noted
        return


def end_leftovers(llm: Any) -> int:
    """SIGKILL what still runs of ``llm``'s noted engine core processes; how many were killed.

    ``psutil.Process.is_running`` compares the start time too, so a reused pid is left alone.
    """
    killed = 0
    for proc in getattr(llm, _PROCESSES, None) or []:
        with contextlib.suppress(Exception):
            if proc.is_running():
                proc.kill()
                killed += 1
    return killed


def _stop(llm: Any) -> None:
    llm.shutdown(_SHUTDOWN_TIMEOUT_S)
    # vLLM closes its sockets but never its ZeroMQ context, which then warns when collected;
    # terminate it here (every socket is closed by now, so this does not block).
    resources = getattr(getattr(llm, "engine_core", None), "resources", None)
    ctx = getattr(resources, "ctx", None)
    if ctx is not None and not ctx.closed:
        ctx.destroy(linger=0)


def finish_reason(vllm_reason: str | None, deadline_hit: bool) -> FinishReason:
    """Our finish reason for vLLM's (None: the stream ended unfinished, i.e. aborted)."""
    if vllm_reason in (None, "abort"):
        return "deadline" if deadline_hit else "abort"
    if vllm_reason == "length":
        return "length"
    return "stop"  # "stop", or "repetition": vLLM cut a looping answer short


class Collected:
    """What one request's vLLM output deltas add up to: text, tokens, top log-probabilities,
    vLLM's finish reason and the time of the first token."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.tops: list[list[float]] = []
        self.completion = 0
        self.vllm_reason: str | None = None
        self.started = time.perf_counter()
        self.first: float | None = None

    def add(self, out: Any) -> str:
        """Take one ``RequestOutput`` delta; returns its new text ("" when none)."""
        piece = out.outputs[0]
        self.completion += len(piece.token_ids)
        if self.first is None and piece.token_ids:
            self.first = time.perf_counter()
        self.tops.extend(token_top_logprobs(piece.logprobs))
        if piece.text:
            self.text.append(piece.text)
        if out.finished:
            self.vllm_reason = piece.finish_reason
        return str(piece.text or "")

    def result(self, prompt_tokens: int, deadline_hit: bool) -> GenerationResult:
        """The request's result, once its outputs ended."""
        first, ended = self.first, time.perf_counter()
        return GenerationResult(
            "".join(self.text),
            finish_reason(self.vllm_reason, deadline_hit),
            prompt_tokens,
            self.completion,
            confidence=confidence_score(self.tops),
            prefill_ms=None if first is None else round((first - self.started) * 1000, 3),
            decode_ms=None if first is None else round((ended - first) * 1000, 3),
        )


def token_top_logprobs(
    positions: Iterable[Mapping[Any, Any] | None] | None, k: int = TOP_K
) -> list[list[float]]:
    """The ``k`` largest log-probabilities of each generated position of a vLLM output delta.

    vLLM gives, per new token, a mapping token id → ``Logprob`` (``.logprob``) holding the top
    ``k`` and the sampled token when it is not among them (so up to ``k + 1`` entries). Positions
    without one (``None``; logprobs not requested) are left out; ``-inf`` entries are kept as
    probability 0.
    """
    if positions is None:
        return []
    out: list[list[float]] = []
    for position in positions:
        if not position:
            continue
        values = sorted((float(entry.logprob) for entry in position.values()), reverse=True)
        out.append(values[:k])
    return out


def is_oom(exc: BaseException) -> bool:
    """True when ``exc`` or anything in its cause/context chain is an out-of-memory error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, MemoryError) or type(current).__name__ == "OutOfMemoryError":
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def raise_native_oom(rid: str) -> None:
    """Raise torch's own out-of-memory error (fault injection; torch is loaded with vLLM)."""
    import torch

    raise torch.OutOfMemoryError(f"injected out-of-memory error for request {rid}")


def sampling_params(v: dict[str, Any], request: GenerationRequest, room: int) -> Any:
    """vLLM ``SamplingParams`` for ``request`` (``v``: :func:`import_vllm`'s names), at most
    ``room`` new tokens."""
    structured = None
    if request.json_schema is not None:
        structured = v["StructuredOutputsParams"](json=request.json_schema)
    elif request.json_output:
        structured = v["StructuredOutputsParams"](json_object=True)
    return v["SamplingParams"](
        max_tokens=max(1, min(request.max_tokens, room)),
        temperature=max(request.temperature, 0.0),
        stop=list(request.stop) if request.stop else None,
        seed=request.seed,
        structured_outputs=structured,
        output_kind=v["RequestOutputKind"].DELTA,
        # The top TOP_K of each token's distribution (raw, before sampling and any JSON
        # mask) feed the confidence score; vLLM adds the sampled token when it is not in them.
        logprobs=TOP_K,
    )


def translate_error(exc: Exception, what: str, dead: bool) -> Exception:
    """Map a vLLM failure on ``what`` onto chainrt's OOM / dead-engine line (``dead``: the
    engine core serving it died)."""
    if isinstance(exc, WorkerError):
        return exc
    if dead:
        return EngineDead(
            f"the vLLM engine core died while serving {what}; recover() restarts it in "
            "process, then retry"
        )
    if is_oom(exc):
        return EngineOOM(
            f"vLLM ran out of memory on {what}; only this request failed, retry it or "
            "lower max_tokens"
        )
    if isinstance(exc, ValueError):
        return WorkerError(f"vLLM refused {what}: {exc}", retryable=False)
    return WorkerError(
        f"vLLM failed on {what} ({type(exc).__name__}: {exc}); retry it", retryable=True
    )
