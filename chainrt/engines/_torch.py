"""The ``torch`` engine: a transformers causal LM on plain torch, for real CUDA memory behaviour.

It exists so that out-of-memory handling can be proven on a real GPU: a request that does not fit
raises a real ``torch.OutOfMemoryError`` in the middle of its forward pass, and the engine must
fail that request alone and serve the next one at once, in the same process.

Concurrency: one GPU thread owns the model and runs requests **one at a time**, lowest
``priority`` first, then in arrival order. A 135M model is tiny next to a GPU, so serialising costs
throughput, not correctness — and an OOM is then attributable to exactly one request, which is the
property under test (a batch would fail every request in it). The decode loop is our own
(prefill, then one token at a time with the KV cache) rather than ``model.generate``: it checks the
deadline and a cancel flag between tokens, streams each token's text, and gives the
out-of-memory error a single place to surface.

After an OOM the failed request's tensors are dropped before anything else happens: the error is
caught, its traceback (which pins the request's activations and KV cache) is released — a full
garbage collection runs only if CUDA memory is still above what was allocated before the request
— and ``torch.cuda.empty_cache()`` hands the cached blocks back to the device; ``EngineOOM``
carries no reference to the torch error. :meth:`TorchEngine.recover` empties the cache again and
proves the engine can generate with a one-token generation (H200: ready again ~0.09 s after the
OOM, p50; ``bench/gpu_oom.py``).

Only the standard library, ``chainrt.errors`` and this package's private modules are imported at
import time; torch and transformers load in :meth:`start`. This keeps the module usable on a GPU
host that has torch + transformers and nothing else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import time
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any

from ..errors import EngineDead, EngineOOM, WorkerError
from ._base import (
    Engine,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    MemoryStats,
    StreamDelta,
)
from ._bridge import EngineJob
from ._confidence import confidence_score
from ._hf_cache import force_offline
from ._hf_model import ModelFacts, PromptTokenizer, resolve_model_dir
from ._host_memory import host_memory
from ._threaded import ThreadedEngine
from ._torch_constrain import JsonConstraint, build_lltokenizer, compile_grammar
from ._torch_decode import DecodeJob, decode, is_oom, warm_shape

__all__ = ["TorchEngine"]

WARM_RUNS = 2
"""How many times :meth:`TorchEngine.warm_like` replays the serving engine's last request."""
WARM_MAX_TOKENS = 16
"""Tokens a warm-up generation may make at most (the last request's ``max_tokens`` if fewer)."""
WARM_SECONDS = 2.0
"""Deadline of one warm-up generation: it delays the swap by at most about this."""
WARM_SHAPES = 8
"""How many of the serving engine's most recent distinct prompt lengths a reload warms."""
WARM_PACE = 3.0
"""After each warm-up forward pass the GPU thread sleeps this many times as long as the pass
took: the warm-up then holds at most a quarter of the interpreter, and the engine still serving
keeps the rest (both threads run Python between kernel launches)."""


class _Paced:
    """A model whose every call is followed by a sleep ``WARM_PACE`` times its length."""

    def __init__(self, model: Any) -> None:
        self._model = model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        out = self._model(*args, **kwargs)
        time.sleep(WARM_PACE * (time.perf_counter() - began))
        return out


class TorchEngine(ThreadedEngine):
    """A transformers causal LM on torch (CUDA when available, else CPU), one GPU thread."""

    name = "torch"
    thread_name = "chainrt-torch"

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        model_name: str = "smollm2-135m-instruct",
        device: str | None = None,
        dtype: str | None = None,
        max_model_len: int = 2048,
        cudnn_attention: bool = False,
    ) -> None:
        """Configure (nothing loads until :meth:`start`).

        ``model`` is an HF model directory (None: the cached SmolLM2 conversion). ``device``
        defaults to ``cuda`` when available, else ``cpu``; ``dtype`` to bfloat16 on CUDA and
        float32 on CPU. ``max_model_len`` caps prompt + completion tokens (and the model's own
        ``max_position_embeddings`` caps it further). ``cudnn_attention`` (CUDA only) lets
        PyTorch pick cuDNN for ``scaled_dot_product_attention``; off by default, process-wide,
        set at each load (the last engine loaded decides). With it, a request whose prompt
        length was new to the engine's thread took 0.33-0.67 s on the H200 instead of
        0.04-0.09 s (``bench/reload_pieces.py``; cuDNN's attention graphs are cached per thread
        and shape), which a hot reload's new engine and any unseen prompt length pay; without it
        PyTorch uses its flash / memory-efficient kernels, which showed no such cost.
        """
        if max_model_len < 16:
            raise WorkerError(f"{max_model_len=} must be at least 16 tokens")
        super().__init__()
        self.model_name = model_name
        self._model_arg = model
        self._device_arg = device
        self._dtype_arg = dtype
        self._max_model_len = max_model_len
        self._cudnn_attention = cudnn_attention
        self._torch: Any = None
        self._model: Any = None
        self._tokenizer: PromptTokenizer | None = None
        self._facts: ModelFacts | None = None
        self._eos: set[int] = set()
        self._lltokenizer: Any = None
        self._dtype_bytes = 4
        self.device: str | None = None
        """``cuda`` or ``cpu`` once loaded."""
        self.model_dir: Path | None = None
        """The HF model directory in use (set once loaded)."""
        self.oom_events = 0
        """Out-of-memory errors caught so far (each failed exactly one request)."""
        self.last_oom_at: float | None = None
        """``time.monotonic()`` when the last out-of-memory error was caught."""
        self.last_oom_error: str | None = None
        """The text of the last out-of-memory error (torch's own message, first line)."""
        self._shapes: OrderedDict[int, int] = OrderedDict()
        self.recent_shapes: tuple[tuple[int, int], ...] = ()
        """``(prompt tokens, most tokens generated after it)`` of the last ``WARM_SHAPES``
        distinct prompt lengths served, oldest first (set by the GPU thread, read by a reload's
        :meth:`warm_like`)."""
        self._warm_plan: tuple[tuple[int, int], ...] = ()

    # -- lifecycle -------------------------------------------------------------------------

    async def recover(self) -> None:
        """Free cached memory and prove the engine generates; reload it if its thread died.

        Raises EngineDead when even that one-token generation fails.
        """
        if not self.thread_alive:
            await asyncio.to_thread(self.reload)
        try:
            await self.submit_and_wait("probe", GenerationRequest(prompt="Hi", max_tokens=1))
        except WorkerError as exc:
            raise EngineDead(
                f"the torch engine cannot generate after recovery ({exc.message}); "
                "restart the worker"
            ) from exc

    async def warm_like(self, serving: Engine) -> None:
        """Before a hot reload's swap: run what the serving engine ran lately, here.

        With cuDNN attention on (``cudnn_attention=True``) the readiness probe alone leaves the
        new engine's first real request slow: on the H200 it took 0.34-0.56 s instead of
        0.04-0.08 s, inside ``scaled_dot_product_attention`` (cProfile,
        ``bench/reload_pieces.py --profile``): PyTorch keeps cuDNN's attention graphs in a
        ``thread_local`` cache keyed by the shapes (``aten/src/ATen/native/cudnn/MHA.cpp``) and
        the new engine runs on a new thread. With it off (the default) that cost is gone; the
        warm-up still runs the shapes once, so nothing first-time is left for a client.

        Two steps: (1) within ``WARM_SECONDS`` in all, every prompt length in the serving
        engine's :attr:`recent_shapes` (up to ``WARM_SHAPES``), prefilled and decoded for as many
        tokens as were generated after it (at most ``WARM_MAX_TOKENS``): the attention shapes
        serving met, whatever the prompts were; (2) the serving engine's last request itself,
        ``WARM_RUNS`` times, ``WARM_SECONDS`` each (tokenizer, chat template, sampling). The GPU
        work ends (a device synchronisation) before this returns, so none of it overlaps the
        first requests after the swap. Lengths not met lately stay cold until first used. No fault injection applies
        and ``last_request`` / ``recent_shapes`` keep describing client traffic only.

        Every warm-up forward pass is paced (``WARM_PACE``): the GPU thread sleeps three times as
        long as the pass took, so the serving engine's thread keeps most of the interpreter.
        Unpaced, the requests in flight across a reload took a median 0.49 s (up to 0.68 s) on
        the H200 against ~0.28 s elsewhere; paced, 0.26 s (up to 0.42 s), and the reload answers
        in ~3 s instead of ~1 s (``docs/gpu.md``).
        """
        shapes = serving.recent_shapes if isinstance(serving, TorchEngine) else ()
        last = serving.last_request if isinstance(serving, ThreadedEngine) else None
        if last is not None and last.messages is None and last.prompt is None:
            last = None
        if not shapes and last is None:
            return
        await self.start()
        if shapes:
            self._warm_plan = shapes
            await self.submit_and_wait("warm-shapes")
        if last is None:
            return
        for _ in range(WARM_RUNS):
            warm = dataclasses.replace(
                last,
                max_tokens=max(1, min(last.max_tokens, WARM_MAX_TOKENS)),
                deadline=time.time() + WARM_SECONDS,
                request_id="reload-warm-up",
            )
            await self.submit_and_wait("warm", warm)

    @property
    def loaded(self) -> bool:
        """True while the model is loaded."""
        return self._model is not None

    def load_model(self) -> None:
        """Load torch, the model and the tokenizer (blocking)."""
        force_offline()
        try:
            import torch
            from transformers import AutoModelForCausalLM
        except ImportError as exc:
            raise WorkerError(
                "torch and transformers are needed by the torch engine; "
                "pip install -e '.[torch]' in the chainrt repository"
            ) from exc
        tokens = self._tokens()
        model_dir = self.model_dir
        device = self._device_arg or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype_name = self._dtype_arg or ("bfloat16" if device.startswith("cuda") else "float32")
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype):
            raise WorkerError(f"{dtype_name=} is not a torch dtype (bfloat16, float16, float32)")
        try:
            # Any: transformers' own annotations of .to()/.eval() do not type-check here.
            model: Any = AutoModelForCausalLM.from_pretrained(
                str(model_dir), dtype=dtype, local_files_only=True
            )
        except (OSError, ValueError) as exc:
            raise WorkerError(f"cannot load the model in {model_dir}: {exc}") from exc
        tokens.load()
        if device.startswith("cuda"):
            torch.backends.cuda.enable_cudnn_sdp(self._cudnn_attention)
        self._model = model.to(device).eval()
        self._torch = torch
        self._facts = ModelFacts.from_config(model.config.to_dict())
        self._dtype_bytes = torch.empty((), dtype=dtype).element_size()
        eos = model.generation_config.eos_token_id
        self._eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        if tokens.eos_token_id is not None:
            self._eos.add(tokens.eos_token_id)
        self.device = device

    def _tokens(self) -> PromptTokenizer:
        if self._tokenizer is None:
            if self.model_dir is None:
                self.model_dir = resolve_model_dir(self._model_arg)
            self._tokenizer = PromptTokenizer(self.model_dir, engine="torch")
        return self._tokenizer

    def unload_model(self) -> None:
        """Drop the model and hand its cached device memory back, without a full collection.

        Dropping the last reference frees the weights at once (refcounting); ``gc.collect()``
        runs only if the model outlived that (held in a reference cycle). A full collection with
        torch and transformers loaded holds the GIL for ~0.23 s (H200 host, 461k tracked objects,
        ``bench/reload_pieces.py``): after a hot reload it stalled the new engine, which serves
        in the same process, by that much. ``empty_cache()`` took ~1 ms and stalled nothing.
        """
        model, self._model = self._model, None
        alive = weakref.ref(model) if model is not None else None
        del model
        self._free_cached(collect=alive is not None and alive() is not None)

    def check_request(self, request: GenerationRequest) -> None:
        """Refuse a JSON Schema llguidance cannot decode into (WorkerError)."""
        if request.constrained:
            compile_grammar(request.json_schema, None)

    def _constraint(self, request: GenerationRequest) -> JsonConstraint | None:
        """The request's JSON constraint (on the GPU thread; builds llguidance's tokenizer once)."""
        if not request.constrained:
            return None
        if self._lltokenizer is None:
            self._lltokenizer = build_lltokenizer(self._tokens().load(), self._eos)
        grammar = compile_grammar(request.json_schema, self._lltokenizer)
        return JsonConstraint(grammar, self._lltokenizer, self._torch)

    # -- accounting ------------------------------------------------------------------------

    def count_tokens(self, request: GenerationRequest) -> int:
        """Prompt tokens after the chat template (what the model will be fed)."""
        return len(self._prompt_ids(request))

    @property
    def context_tokens(self) -> int:
        """Size of the context window in tokens (prompt + completion)."""
        if self._facts is None:
            return self._max_model_len
        return min(self._max_model_len, self._facts.max_position_embeddings)

    def memory(self) -> MemoryStats | None:
        """Device memory: ``torch.cuda.mem_get_info`` (+ torch's cached, unused blocks) on CUDA,
        available RAM on CPU (``MemAvailable``: page cache counts as free; a cgroup limit caps
        it); KV bytes per token from the model config."""
        torch = self._torch
        if torch is None or self._facts is None or self.device is None:
            return None
        per_token = self._facts.kv_bytes_per_token(self._dtype_bytes)
        if self.device.startswith("cuda"):
            device_free, total = torch.cuda.mem_get_info(self.device)
            reserved = torch.cuda.memory_reserved(self.device)
            cached_free = reserved - torch.cuda.memory_allocated(self.device)
            free = device_free + cached_free
            extra = {"reserved_bytes": float(reserved), "cached_free_bytes": float(cached_free)}
        else:
            total, free = host_memory()
            extra = {}
        extra.update(
            {
                "queued": float(self.queued),
                "context_tokens": float(self.context_tokens),
                "oom_events": float(self.oom_events),
            }
        )
        return MemoryStats(
            total_bytes=int(total), free_bytes=int(free), kv_bytes_per_token=per_token, extra=extra
        )

    def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        return self._tokens().prompt_ids(request, self.context_tokens)

    # -- GPU thread ------------------------------------------------------------------------

    def run_job(self, job: EngineJob) -> StreamDelta | BaseException:
        """A generation, a ``probe`` or a reload's ``warm`` generation (on the GPU thread); an
        OOM fails this job alone."""
        oom: str | None = None
        caught_at = 0.0
        baseline = self._allocated()  # what is allocated before this request runs
        try:
            if job.kind == "probe":
                self._free_cached()
            if job.kind == "warm-shapes":
                return self._warm_shapes()
            return self._generate(job)
        except WorkerError as exc:
            return exc
        except Exception as exc:
            # Keep only text: the exception's traceback pins this request's tensors.
            if not is_oom(exc, self._torch):
                self._dead = f"{type(exc).__name__}: {exc}"
                return EngineDead(f"the torch engine failed: {self._dead}")
            caught_at = time.monotonic()
            oom = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
        # Out of the except block the failed request's tensors are unreachable: free them.
        # Refcounting has freed the request's tensors by now; a full collection (costly with
        # torch loaded) runs only if something it allocated is still held.
        self._free_cached(collect=self._allocated() > baseline)
        self.oom_events += 1
        self.last_oom_at = caught_at
        self.last_oom_error = oom
        request = job.request
        return EngineOOM(
            f"the torch engine ran out of {self.device} memory on request "
            f"{request.request_id if request and request.request_id else '?'} ({oom}); "
            "only this request failed, retry it or lower max_tokens"
        )

    def _warm_shapes(self) -> StreamDelta:
        """Prefill and decode each planned shape once (GPU thread); then wait for the device."""
        plan, self._warm_plan = self._warm_plan, ()
        if self._model is None:
            raise EngineDead("the torch engine has no model loaded")
        deadline = time.monotonic() + WARM_SECONDS
        for prompt_tokens, generated in reversed(plan):  # the most recent first
            if time.monotonic() >= deadline:
                break
            # A prompt whose first token was end-of-sequence still had its prefill: 1 at least.
            budget = min(max(generated, 1), WARM_MAX_TOKENS, self.context_tokens - prompt_tokens)
            if prompt_tokens >= 1 and budget >= 1:
                warm_shape(
                    _Paced(self._model), self._torch, self.device or "cpu", prompt_tokens, budget
                )
        if self.device is not None and self.device.startswith("cuda"):
            self._torch.cuda.synchronize(self.device)
        return StreamDelta("")

    def _remember_shape(self, prompt_tokens: int, generated: int) -> None:
        """Note a served prompt length and how far it decoded (GPU thread)."""
        shapes = self._shapes
        shapes[prompt_tokens] = max(generated, shapes.pop(prompt_tokens, 0))
        while len(shapes) > WARM_SHAPES:
            shapes.popitem(last=False)
        self.recent_shapes = tuple(shapes.items())

    def _allocated(self) -> int:
        torch = self._torch
        if torch is None or self.device is None or not self.device.startswith("cuda"):
            return 0
        return int(torch.cuda.memory_allocated(self.device))

    def _free_cached(self, *, collect: bool = False) -> None:
        if collect:  # tensors caught in reference cycles are freed only by the collector
            gc.collect()
        torch = self._torch
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _generate(self, job: EngineJob) -> StreamDelta:
        request = job.request
        assert request is not None
        if self._model is None:
            raise EngineDead("the torch engine has no model loaded")
        ids = self._prompt_ids(request)
        deadline = request.deadline

        def interrupted() -> FinishReason | None:
            if job.cancelled.is_set():
                return "abort"
            if deadline is not None and time.time() >= deadline:
                return "deadline"
            return None

        started = time.perf_counter()
        work = DecodeJob(
            model=_Paced(self._model) if job.kind == "warm" else self._model,
            torch=self._torch,
            device=self.device or "cpu",
            prompt_ids=ids,
            request=request,
            budget=min(request.max_tokens, self.context_tokens - len(ids)),
            eos=self._eos,
            tokens=self._tokens(),
            emit=lambda piece: job.sink(StreamDelta(piece)),
            interrupted=interrupted,
            # Injected faults surface where a real one would: at the forward pass.
            inject_oom=job.kind == "generate" and self.faults.take_oom(),
            constraint=self._constraint(request),
        )
        reason, text, produced = decode(work)
        if job.kind == "generate":
            self._remember_shape(len(ids), produced)
        first = work.marks[0] if work.marks else time.perf_counter()
        return StreamDelta(
            "",
            GenerationResult(
                text,
                reason,
                len(ids),
                produced,
                confidence=confidence_score(work.tops),
                prefill_ms=round((first - started) * 1000, 3),
                decode_ms=round((time.perf_counter() - first) * 1000, 3),
            ),
        )
