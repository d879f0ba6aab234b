"""The model-thread skeleton shared by the in-process engines (llama.cpp, torch).

Neither a ``llama_cpp.Llama`` nor a torch model with its KV cache may be driven from two threads,
so each of these engines gives its model one dedicated thread. :class:`ThreadedEngine` owns that
thread and everything around it: the priority job queue (lower ``GenerationRequest.priority``
first, then arrival order), loading and shutdown, failing what is still queued when the engine
closes, the async surface (:meth:`~ThreadedEngine.stream` / :meth:`~ThreadedEngine.generate`
through :func:`~chainrt.engines._bridge.stream_job`) and housekeeping jobs awaited by
:meth:`~ThreadedEngine.submit_and_wait` (a cache reset, a health probe).

A subclass says how to load and free its model and how to run one job on the model thread
(:meth:`~ThreadedEngine.run_job`); it never touches the queue or the thread itself.

A model is freed only once its thread has stopped: no thread is ever inside llama.cpp (or torch)
when its model goes. That holds at interpreter exit too. The model thread is a daemon (a blocked
``queue.get`` must not keep a process alive), so nothing would wait for a generation that was cut
off (a step's deadline, a cancelled run): the process would reach C-level exit with the thread
still inside ``llama_decode``, and exit's destructors of llama.cpp/ggml's globals would be torn
down under it: a segmentation fault after a run had completed and printed (exit code 139, nothing
from faulthandler, which is gone by then). So every engine whose thread runs is stopped by an
``atexit`` hook (:func:`_stop_all_at_exit`): the generation in flight is cancelled and ends at its
next token or prompt chunk, the thread is joined, and only then is the model freed.
"""

from __future__ import annotations

import abc
import asyncio
import atexit
import contextlib
import itertools
import logging
import queue
import threading
import weakref
from collections.abc import AsyncIterator
from contextlib import aclosing

from ..errors import EngineDead, WorkerError
from ._base import Engine, EngineRetired, GenerationRequest, GenerationResult, StreamDelta
from ._bridge import EngineJob, stream_job

__all__ = ["EXIT_JOIN_S", "ThreadedEngine"]

log = logging.getLogger(__name__)

EXIT_JOIN_S = 30.0
"""How long interpreter exit waits for a model thread to leave its job. A cancelled generation
stops at its next token or prompt chunk (tens of ms on two cores), so this is only reached by a
single model call that hangs; then the model is left loaded rather than freed under the thread."""

_STOP_PRIORITY = -2
"""The stop job overtakes everything queued."""
HOUSEKEEPING_PRIORITY = -1
"""Resets and probes run ahead of every queued request."""


class ThreadedEngine(Engine):
    """An engine whose model lives on one thread that runs jobs one at a time, by priority."""

    thread_name = "chainrt-engine"
    """Name of the model thread (shows in thread dumps and profilers)."""

    def __init__(self) -> None:
        self._load_lock = threading.Lock()
        self._jobs: queue.PriorityQueue[EngineJob] = queue.PriorityQueue()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._current: EngineJob | None = None
        self._dead: str | None = None
        """Why the engine is dead (None while it serves); set by the model thread."""
        self._retired = False
        """Set by :meth:`retire`: generations not started yet are handed back, not run."""
        self._exiting = False
        """Set at interpreter exit: the model is stopped for good and never loaded again."""
        self.last_request: GenerationRequest | None = None
        """The last generation this engine started (set by the model thread; housekeeping jobs
        do not count). A hot reload's :meth:`~Engine.warm_like` replays its shape on the new
        engine: what the KV cache holds, what the clients are asking."""

    # -- what a subclass provides -------------------------------------------------------------

    @property
    @abc.abstractmethod
    def loaded(self) -> bool:
        """True while a model is loaded."""

    @abc.abstractmethod
    def load_model(self) -> None:
        """Load the model (blocking; called under the load lock, before the thread starts)."""

    @abc.abstractmethod
    def unload_model(self) -> None:
        """Drop the model and free its memory (blocking; the thread has stopped)."""

    @abc.abstractmethod
    def run_job(self, job: EngineJob) -> StreamDelta | BaseException:
        """Run one job on the model thread; return the final delta or the job's error.

        Text pieces go to ``job.sink`` as they are made. Errors a request can cause are returned,
        not raised; an exception that escapes marks the engine dead.
        """

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the model and start its thread (idempotent; also done lazily on first use)."""
        if not self.loaded:
            await asyncio.to_thread(self.ensure_loaded)

    async def close(self) -> None:
        """Stop the model thread (pending requests fail with WorkerError) and free the model."""
        await asyncio.to_thread(self._shutdown)

    def ensure_loaded(self) -> None:
        """Load the model and start the model thread unless already done (blocking)."""
        with self._load_lock:
            if self._exiting:
                raise WorkerError(f"the {self.name} engine was stopped: the process is exiting")
            if not self.loaded:
                self.load_model()
                self._dead = None
                self._thread = threading.Thread(
                    target=self._serve, name=self.thread_name, daemon=True
                )
                _running.add(self)
                self._thread.start()

    @property
    def thread_alive(self) -> bool:
        """True while the engine serves: its thread runs and it is not marked dead."""
        return self._dead is None and self._thread is not None and self._thread.is_alive()

    def reload(self) -> None:
        """Stop, free and load the model again, in this process (blocking)."""
        self._shutdown()
        self.ensure_loaded()

    def retire(self) -> int:
        """Hand back every queued generation (:class:`EngineRetired`); later ones at once too.

        The queued jobs are taken out of the queue here, in their order, so none waits for the
        generation running now; housekeeping jobs stay queued. A generation the model thread
        picks up after this (one submitted from another thread meanwhile) is handed back too.
        """
        self._retired = True
        kept: list[EngineJob] = []
        handed = 0
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job.kind != "generate":
                kept.append(job)
            elif not job.cancelled.is_set():
                job.sink(self._retired_error())
                handed += 1
        for job in kept:
            self._jobs.put(job)
        return handed

    def _retired_error(self) -> EngineRetired:
        return EngineRetired(
            f"a hot reload replaced this {self.name} engine before the request started"
        )

    def _shutdown(self, timeout_s: float | None = None) -> bool:
        """Stop the model thread (the job in flight cancelled, ending at its next token), fail
        what is queued and free the model; True when done. With ``timeout_s``, the load lock (a
        close already under way elsewhere holds it) and the thread are each waited for at most
        that long, and a thread still inside its job keeps its model (False): freeing a model
        under a thread that runs it is a crash, not a shutdown."""
        if not self._load_lock.acquire(timeout=-1 if timeout_s is None else timeout_s):
            return False
        try:
            thread = self._thread
            if thread is not None and thread.is_alive():
                current = self._current
                if current is not None:
                    current.cancelled.set()
                self._jobs.put(EngineJob(_STOP_PRIORITY, next(self._seq), "stop"))
                thread.join(timeout_s)
                if thread.is_alive():
                    return False
            self._thread = None
            _running.discard(self)
            closed = WorkerError(f"the {self.name} engine was closed; start it again")
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                job.sink(closed)
            self.unload_model()
            return True
        finally:
            self._load_lock.release()

    def stop_for_exit(self, timeout_s: float = EXIT_JOIN_S) -> bool:
        """Stop the engine for good (interpreter exit): cancel the generation in flight, wait
        up to ``timeout_s`` for the thread to leave it, then free the model; False if the thread
        did not stop in time (the model is then left loaded, never freed under it)."""
        self._exiting = True
        return self._shutdown(timeout_s)

    # -- async surface ------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate the whole answer; at the deadline, the text so far (``"deadline"``)."""
        async for delta in self.stream(request):
            if delta.result is not None:
                return delta.result
        raise EngineDead(f"the {self.name} engine ended a generation without a result")

    async def stream(self, request: GenerationRequest) -> AsyncIterator[StreamDelta]:
        """Yield text pieces as tokens arrive; the last delta carries the whole result.

        Closing or cancelling the consumer stops the model thread at its next token.
        """
        self.check_request(request)
        await self.start()
        if self._retired:
            raise self._retired_error()
        if self._dead is not None:
            raise EngineDead(f"the {self.name} engine is dead ({self._dead}); recover() reloads it")
        job = EngineJob(request.priority, next(self._seq), "generate", request)
        # aclosing: closing this stream must cancel the job now, not when the GC gets to it.
        async with aclosing(stream_job(job, self._jobs)) as deltas:
            async for delta in deltas:
                yield delta

    async def submit_and_wait(
        self, kind: str, request: GenerationRequest | None = None
    ) -> StreamDelta:
        """Run a housekeeping job (``kind``) ahead of every queued request; its final delta.

        The job's error, if any, is raised here.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[StreamDelta] = loop.create_future()

        def sink(item: StreamDelta | BaseException) -> None:
            def settle() -> None:
                if done.done():
                    return
                if isinstance(item, BaseException):
                    done.set_exception(item)
                elif item.result is not None or not item.text:  # the final delta
                    done.set_result(item)

            # The waiting loop may be closed (its caller gone): the model thread must go on.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle)

        job = EngineJob(HOUSEKEEPING_PRIORITY, next(self._seq), kind, request, sink=sink)
        self._jobs.put(job)
        return await done

    @property
    def queued(self) -> int:
        """Jobs waiting for the model thread."""
        return self._jobs.qsize()

    # -- model thread -------------------------------------------------------------------------

    def _serve(self) -> None:
        """Body of the model thread: run jobs until told to stop; never dies on a job's error."""
        while True:
            job = self._jobs.get()
            if job.kind == "stop":
                return
            if job.cancelled.is_set():
                continue
            if job.kind == "generate" and self._retired:
                job.sink(self._retired_error())
                continue
            if not self.loaded:
                job.sink(EngineDead(f"the {self.name} engine has no model loaded"))
                continue
            self._current = job
            if job.kind == "generate":
                self.last_request = job.request
            try:
                outcome = self.run_job(job)
            except Exception as exc:  # a bug must fail one request, not the thread
                self._dead = f"{type(exc).__name__}: {exc}"
                outcome = EngineDead(f"the {self.name} engine failed unexpectedly: {self._dead}")
            finally:
                self._current = None
            job.sink(outcome)


_running: weakref.WeakSet[ThreadedEngine] = weakref.WeakSet()
"""Engines whose model thread runs (added when the thread starts, removed when it stops)."""


def _stop_all_at_exit() -> None:
    """At interpreter exit, before Python and then C tear anything down: stop every running
    model thread and free its model (see the module docstring)."""
    for engine in list(_running):
        try:
            stopped = engine.stop_for_exit()
        except Exception as exc:  # exit goes on for the other engines
            log.warning("stopping the %s engine at exit failed: %s", engine.name, exc)
            continue
        if not stopped:
            log.warning(
                "the %s engine's thread did not leave its job within %.0f s of exit; its model "
                "is left loaded",
                engine.name,
                EXIT_JOIN_S,
            )


atexit.register(_stop_all_at_exit)
