"""The ``local`` engine: SmolLM2-135M-Instruct (or any GGUF chat model) on llama.cpp, in process.

A ``llama_cpp.Llama`` object is not thread-safe, so one dedicated thread owns it and takes jobs
from a priority queue (lower ``GenerationRequest.priority`` first, then arrival order). Async
callers get their tokens through ``loop.call_soon_threadsafe``, which keeps the engine usable from
any event loop (the runner's sync API starts a fresh loop per call). Between prompt chunks and
between tokens the thread checks the request's deadline and a cancellation flag, so a cancelled
caller stops the work at the next token instead of burning CPU.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import queue
import threading
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path

from chainrt.errors import EngineDead, EngineOOM, WorkerError

from ._base import Engine, GenerationRequest, GenerationResult, MemoryStats, StreamDelta
from ._bridge import EngineJob, stream_job
from ._llamacpp_model import LlamaModel, resolve_model_path

__all__ = ["LocalEngine"]


class LocalEngine(Engine):
    """llama.cpp engine for a small GGUF chat model; loads lazily on first use."""

    name = "local"

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
        self.model_name = model_name
        self._explicit_path = model_path
        self._n_ctx = n_ctx
        self._n_threads = n_threads
        self._seed = seed
        self._repeat_penalty = repeat_penalty
        self._load_lock = threading.Lock()
        self._model: LlamaModel | None = None
        self._jobs: queue.PriorityQueue[EngineJob] = queue.PriorityQueue()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._dead: str | None = None
        self._current: EngineJob | None = None

    @property
    def model_path(self) -> Path | None:
        """The GGUF file in use (None until loaded)."""
        return self._model.path if self._model is not None else None

    @property
    def context_tokens(self) -> int:
        """Size of the context window in tokens (prompt + completion)."""
        return self._n_ctx

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the model and start its thread (idempotent; also done lazily on first use)."""
        if self._model is None:
            await asyncio.to_thread(self._ensure_loaded)

    async def close(self) -> None:
        """Stop the model thread (pending requests fail with WorkerError) and free the model."""
        await asyncio.to_thread(self._shutdown)

    async def recover(self) -> None:
        """After EngineOOM clear the KV cache; after EngineDead reload the model in process."""
        if self._dead is not None or self._thread is None or not self._thread.is_alive():
            await asyncio.to_thread(self._reload)
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def sink(item: StreamDelta | BaseException) -> None:
            def settle() -> None:
                if done.done():
                    return
                if isinstance(item, BaseException):
                    done.set_exception(item)
                else:
                    done.set_result(None)

            loop.call_soon_threadsafe(settle)

        # Ahead of every queued request, so they all start from a clean cache.
        self._jobs.put(EngineJob(-1, next(self._seq), "reset", sink=sink))
        await done

    def _ensure_loaded(self) -> LlamaModel:
        with self._load_lock:
            if self._model is None:
                self._model = LlamaModel(
                    resolve_model_path(self._explicit_path),
                    n_ctx=self._n_ctx,
                    n_threads=self._n_threads,
                    seed=self._seed,
                    repeat_penalty=self._repeat_penalty,
                )
                self._dead = None
                self._thread = threading.Thread(
                    target=self._serve, name="chainrt-llamacpp", daemon=True
                )
                self._thread.start()
            return self._model

    def _shutdown(self) -> None:
        with self._load_lock:
            thread, self._thread = self._thread, None
            if thread is not None and thread.is_alive():
                current = self._current
                if current is not None:
                    current.cancelled.set()
                self._jobs.put(EngineJob(-2, next(self._seq), "stop"))
                thread.join()
            self._fail_pending(WorkerError("the local engine was closed; start it again"))
            # Dropping the reference frees the model at once (Llama.__del__ closes it) unless a
            # count_tokens() on another thread still holds it; closing it explicitly here could
            # free the vocabulary under that thread's feet.
            self._model = None

    def _reload(self) -> None:
        self._shutdown()
        self._ensure_loaded()

    def _fail_pending(self, error: WorkerError) -> None:
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            job.sink(error)

    # -- async surface ---------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate the whole answer; stops at the deadline with the text so far."""
        async for delta in self.stream(request):
            if delta.result is not None:
                return delta.result
        raise EngineDead("the local engine ended a generation without a result")  # unreachable

    async def stream(self, request: GenerationRequest) -> AsyncIterator[StreamDelta]:
        """Yield text pieces as tokens arrive; the last delta carries the whole result.

        Closing or cancelling the consumer stops the model thread at its next token.
        """
        await self.start()
        if self._dead is not None:
            raise EngineDead(f"the local engine is dead ({self._dead}); recover() reloads it")
        job = EngineJob(request.priority, next(self._seq), "generate", request)
        # aclosing: closing this stream must cancel the job now, not when the GC gets to it.
        async with aclosing(stream_job(job, self._jobs)) as deltas:
            async for delta in deltas:
                yield delta

    def count_tokens(self, request: GenerationRequest) -> int:
        """Prompt tokens after the chat template (the model's tokenizer; loads it if needed)."""
        return len(self._ensure_loaded().prompt_tokens(request))

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
            extra={"context_tokens": float(model.n_ctx), "queued": float(self._jobs.qsize())},
        )

    # -- model thread ----------------------------------------------------------------------

    def _serve(self) -> None:
        """Body of the model thread: run jobs until told to stop; never dies on a job's error."""
        while True:
            job = self._jobs.get()
            model = self._model
            if job.kind == "stop":
                return
            if model is None:
                job.sink(EngineDead("the local engine has no model loaded"))
            elif job.kind == "reset":
                model.clear_cache()
                job.sink(StreamDelta(""))
            elif not job.cancelled.is_set():
                self._current = job
                try:
                    self._run(model, job)
                finally:
                    self._current = None

    def _run(self, model: LlamaModel, job: EngineJob) -> None:
        assert job.request is not None
        try:
            result = model.generate(job.request, job.sink, job.cancelled.is_set, self.faults)
        except EngineDead as exc:
            self._dead = exc.message
            job.sink(exc)
        except WorkerError as exc:
            job.sink(exc)
        except MemoryError:
            model.clear_cache()
            job.sink(EngineOOM("the local engine ran out of host memory on one request"))
        except Exception as exc:  # a bug must fail one request, not the thread
            self._dead = f"{type(exc).__name__}: {exc}"
            job.sink(EngineDead(f"the local engine failed unexpectedly: {self._dead}"))
        else:
            job.sink(StreamDelta("", result))
