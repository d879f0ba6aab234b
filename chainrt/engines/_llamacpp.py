"""The ``local`` engine: SmolLM2-135M-Instruct (or any GGUF chat model) on llama.cpp, in process.

A ``llama_cpp.Llama`` object is not thread-safe, so one dedicated thread owns it
(:class:`~chainrt.engines._threaded.ThreadedEngine`: a priority queue, lower
``GenerationRequest.priority`` first, then arrival order). Async callers get their tokens through
``loop.call_soon_threadsafe``, which keeps the engine usable from any event loop (the runner's
sync API starts a fresh loop per call). Between prompt chunks and between tokens the thread checks
the request's deadline and a cancellation flag, so a cancelled caller stops the work at the next
token instead of burning CPU.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from ..errors import EngineDead, EngineOOM, WorkerError
from ._base import Engine, GenerationRequest, MemoryStats, StreamDelta
from ._bridge import EngineJob
from ._llamacpp_model import LlamaModel, json_grammar, resolve_model_path
from ._threaded import ThreadedEngine

__all__ = ["LocalEngine"]


class LocalEngine(ThreadedEngine):
    """llama.cpp engine for a small GGUF chat model; loads lazily on first use."""

    name = "local"
    thread_name = "chainrt-llamacpp"

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        model_name: str = "local",
        n_ctx: int = 2048,
        n_threads: int | None = None,
        seed: int = 0,
        repeat_penalty: float = 1.1,
    ) -> None:
        super().__init__()
        self.model_name = model_name
        self._explicit_path = model_path
        self._n_ctx = n_ctx
        self._n_threads = n_threads
        self._seed = seed
        self._repeat_penalty = repeat_penalty
        self._model: LlamaModel | None = None

    @property
    def model_path(self) -> Path | None:
        """The GGUF file in use (None until loaded)."""
        return self._model.path if self._model is not None else None

    @property
    def context_tokens(self) -> int:
        """Size of the context window in tokens (prompt + completion)."""
        return self._n_ctx

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        """True while the GGUF model is loaded."""
        return self._model is not None

    def load_model(self) -> None:
        """Load the GGUF file (blocking)."""
        self._model = LlamaModel(
            resolve_model_path(self._explicit_path),
            n_ctx=self._n_ctx,
            n_threads=self._n_threads,
            seed=self._seed,
            repeat_penalty=self._repeat_penalty,
        )

    def unload_model(self) -> None:
        """Drop the model.

        Dropping the reference frees the model at once (Llama.__del__ closes it) unless a
        count_tokens() on another thread still holds it; closing it explicitly here could free
        the vocabulary under that thread's feet.
        """
        self._model = None

    async def recover(self) -> None:
        """After EngineOOM clear the KV cache; after EngineDead reload the model in process."""
        if not self.thread_alive:
            await asyncio.to_thread(self.reload)
            return
        # Ahead of every queued request, so they all start from a clean cache.
        await self.submit_and_wait("reset")

    async def warm_like(self, serving: Engine) -> None:
        """Evaluate the prompt of the serving engine's last request (prefill only, no token), so
        this engine's prompt cache holds the same prefix: the first requests after a reload's swap
        reuse it as they did on the old engine (e.g. a shared system prompt). Tokenized by this
        engine's own model, so a model with another vocabulary is warmed correctly too."""
        last = serving.last_request if isinstance(serving, ThreadedEngine) else None
        if last is None or (last.messages is None and last.prompt is None):
            return
        await self.start()
        await self.submit_and_wait("warm", last)

    def _ensure_model(self) -> LlamaModel:
        self.ensure_loaded()
        model = self._model
        if model is None:  # closed by another thread in between
            raise WorkerError("the local engine was closed; start it again")
        return model

    def check_request(self, request: GenerationRequest) -> None:
        """Refuse a JSON Schema that llama.cpp's grammar cannot express (WorkerError)."""
        if request.json_schema is not None:
            json_grammar(request.json_schema)

    # -- accounting ------------------------------------------------------------------------

    def count_tokens(self, request: GenerationRequest) -> int:
        """Prompt tokens after the chat template (the model's tokenizer; loads it if needed)."""
        return len(self._ensure_model().prompt_tokens(request))

    def memory(self) -> MemoryStats | None:
        """The KV cache of the context; requests run one at a time and each gets all of it."""
        model = self._model
        if model is None:
            return None
        total = model.n_ctx * model.kv_bytes_per_token
        return MemoryStats(
            total_bytes=total,
            free_bytes=total,
            kv_bytes_per_token=model.kv_bytes_per_token,
            extra={"context_tokens": float(model.n_ctx), "queued": float(self.queued)},
        )

    # -- model thread ----------------------------------------------------------------------

    def run_job(self, job: EngineJob) -> StreamDelta | BaseException:
        """A generation, or a ``reset`` of the KV cache (on the model thread)."""
        model = self._model
        assert model is not None  # the thread checks before every job
        if job.kind == "reset":
            model.clear_cache()
            return StreamDelta("")
        assert job.request is not None
        if job.kind == "warm":
            try:
                model.prefill(job.request)
            except (WorkerError, RuntimeError, MemoryError) as exc:
                model.clear_cache()
                return WorkerError(f"warming the prompt cache failed: {exc}")
            return StreamDelta("")
        try:
            result = model.generate(job.request, job.sink, job.cancelled.is_set, self.faults)
        except EngineDead as exc:
            self._dead = exc.message
            return exc
        except WorkerError as exc:
            return exc
        except MemoryError:
            model.clear_cache()
            return EngineOOM("the local engine ran out of host memory on one request")
        return StreamDelta("", result)
