"""Where a torch hot reload's latency goes, piece by piece, in one process (a GPU host).

    python bench/reload_pieces.py [--requests 8] [--max-tokens 8]

Builds the random-weights Llama of ``bench/gpu_oom.py`` and, with the torch engine, measures:

1. ``baseline``: the bench's request ("Name a color.", ``--max-tokens``) run one at a time on a
   warm engine (median, max);
2. ``first after probe``: a second engine, loaded and given only the readiness probe, then the
   same request ``--requests`` times, one at a time, nothing else running (is its first real
   request slower: a warm-up cost?);
3. ``first after warm_like``: the same with ``warm_like(serving engine)`` after the probe;
   then a prompt length no engine met, three times on the warm serving engine; then, with cuDNN
   attention turned on (``TorchEngine(cudnn_attention=True)``; the engines above run with the
   default, off), a third engine's first requests after the probe, a new prompt length and its
   warm latency;
4. ``two engines at once``: 4 requests on each of two engines at the same time vs 8 on one
   (the drain right after a swap, when old and new engine both run);
5. the old engine's teardown, each piece timed alone (thread stop, dropping the model, the
   weights' memory then, ``gc.collect()``, ``torch.cuda.empty_cache()``), while a client keeps
   sending the request to the new engine: the slowest request overlapping each piece;
6. the same with the engine's own ``close()``.

``--profile`` prints cProfile's top functions (own time) of the first generation after the probe.

Figures are what this machine did in this run.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import pstats
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gpu_oom import build_random_model  # noqa: E402

from chainrt.engines._base import ChatMessage, GenerationRequest  # noqa: E402
from chainrt.engines._torch import TorchEngine  # noqa: E402
from workers.server._health import probe_engine  # noqa: E402


def ask(max_tokens: int) -> GenerationRequest:
    """The bench's request (``bench/reload.py``'s clients)."""
    return GenerationRequest(
        messages=[ChatMessage("user", "Name a color.")], max_tokens=max_tokens, temperature=0.0
    )


def other_ask(max_tokens: int, variant: int) -> GenerationRequest:
    """A request whose prompt length no engine met before (``variant`` picks one)."""
    words = " ".join(["again"] * (3 + 4 * variant))
    return GenerationRequest(
        messages=[ChatMessage("user", f"Name a color, {words}.")],
        max_tokens=max_tokens,
        temperature=0.0,
    )


async def timed(engine: TorchEngine, request: GenerationRequest) -> float:
    """Seconds one generation takes."""
    started = time.perf_counter()
    await engine.generate(request)
    return time.perf_counter() - started


def ms(values: list[float]) -> str:
    """Milliseconds, one decimal, comma separated."""
    return ", ".join(f"{v * 1000:.1f}" for v in values)


class Client:
    """Requests back to back on one engine, from a thread of its own (as the worker's clients)."""

    def __init__(self, engine: TorchEngine, request: GenerationRequest) -> None:
        self.spans: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(engine, request))

    def _run(self, engine: TorchEngine, request: GenerationRequest) -> None:
        async def loop() -> None:
            while not self._stop.is_set():
                started = time.perf_counter()
                await engine.generate(request)
                self.spans.append((started, time.perf_counter()))

        asyncio.run(loop())

    def __enter__(self) -> Client:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def slowest_across(self, start: float, end: float) -> float:
        """The longest request that overlapped [start, end]."""
        hit = [e - s for s, e in self.spans if e >= start and s <= end]
        return max(hit) if hit else 0.0


async def piece(
    client: Client, label: str, run: Callable[[], Awaitable[Any]], note: Callable[[], str]
) -> None:
    """Time one teardown piece (in a worker thread, as the engine's close runs it)."""
    await asyncio.sleep(0.5)
    started = time.perf_counter()
    await run()
    ended = time.perf_counter()
    await asyncio.sleep(0.3)
    print(
        f"  {label}: {(ended - started) * 1000:.1f} ms; slowest new-engine request across it "
        f"{client.slowest_across(started, ended) * 1000:.1f} ms; {note()}"
    )


async def main_async(args: argparse.Namespace) -> None:
    """Run the measurements in order."""
    import torch

    backends: Any = torch.backends  # some of its functions are untyped
    print(f"torch {torch.__version__}, cuDNN {backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA'}")  # fmt: skip
    folder = Path(tempfile.mkdtemp(prefix="chainrt-pieces-"))
    try:
        first = build_random_model(folder / "v1")
        copies = [folder / f"v{n}" for n in (2, 3, 4)]
        for copy in copies:
            shutil.copytree(first, copy)
        request = ask(args.max_tokens)
        old = TorchEngine(first, model_name="v1")
        await old.start()
        for _ in range(5):
            await timed(old, request)
        base = [await timed(old, request) for _ in range(20)]
        print(f"baseline (warm engine): median {statistics.median(base) * 1000:.1f} ms, "
              f"max {max(base) * 1000:.1f} ms")  # fmt: skip
        print(f"python objects tracked by gc: {len(gc.get_objects())}")

        cold = TorchEngine(copies[0], model_name="v2")
        await cold.start()
        probe = await probe_engine(cold, 10)
        if args.profile:
            profile_next_generation(cold)
        split = await cold.generate(request)
        print(f"first request after probe: prefill {split.prefill_ms} ms, decode "
              f"{split.decode_ms} ms ({split.completion_tokens} tokens)")  # fmt: skip
        cold_runs = [await timed(cold, request) for _ in range(args.requests)]
        print(f"first after probe (probe ok={probe.ok}): {ms(cold_runs)} ms")

        warm = TorchEngine(copies[1], model_name="v3")
        await warm.start()
        await probe_engine(warm, 10)
        started = time.perf_counter()
        await warm.warm_like(old)
        warmed = time.perf_counter() - started
        warm_runs = [await timed(warm, request) for _ in range(args.requests)]
        print(f"first after warm_like ({warmed * 1000:.1f} ms, warmed shapes "
              f"{list(old.recent_shapes)}): {ms(warm_runs)} ms")  # fmt: skip

        # A prompt length neither engine met: does a warm engine pay a first-time cost too?
        fresh_length = [await timed(old, other_ask(args.max_tokens, 1)) for _ in range(3)]
        print(f"a new prompt length on the warm serving engine: {ms(fresh_length)} ms")

        print(f"cuDNN attention enabled: {backends.cuda.cudnn_sdp_enabled()}; a third "
              "engine with cudnn_attention=True (turns it on in the process):")  # fmt: skip
        other = TorchEngine(copies[2], model_name="v4", cudnn_attention=True)
        try:
            await other.start()
            await probe_engine(other, 10)
            other_runs = [await timed(other, request) for _ in range(args.requests)]
            print(f"  first after probe, cuDNN attention on: {ms(other_runs)} ms")
            again = [await timed(other, other_ask(args.max_tokens, 2)) for _ in range(3)]
            print(f"  a new prompt length, cuDNN attention on: {ms(again)} ms")
            base_on = [await timed(other, request) for _ in range(20)]
            print(f"  warm, cuDNN attention on: median {statistics.median(base_on) * 1000:.1f}"
                  f" ms, max {max(base_on) * 1000:.1f} ms")  # fmt: skip
        finally:
            await other.close()
            torch.backends.cuda.enable_cudnn_sdp(False)  # the other engines' setting again

        started = time.perf_counter()
        await asyncio.gather(*(timed(old, request) for _ in range(8)))
        alone = time.perf_counter() - started
        started = time.perf_counter()
        both = await asyncio.gather(
            *(timed(engine, request) for engine in (old, warm) for _ in range(4))
        )
        together = time.perf_counter() - started
        print(
            f"8 requests on one engine: {alone * 1000:.1f} ms; 4 on each of two engines at "
            f"once: {together * 1000:.1f} ms (slowest request {max(both) * 1000:.1f} ms)"
        )

        def allocated() -> str:
            return f"allocated {torch.cuda.memory_allocated() / 2**20:.1f} MiB, reserved " \
                   f"{torch.cuda.memory_reserved() / 2**20:.1f} MiB"  # fmt: skip

        print("teardown of the old engine, pieces, while a client uses the new one:")
        with Client(warm, request) as client:
            await asyncio.sleep(1.0)
            print(f"  before: {allocated()}")
            thread = old._thread

            def stop_thread() -> None:
                old._thread = None
                old._jobs.put(_stop_job(old))
                if thread is not None:
                    thread.join()

            await piece(client, "thread stop", lambda: asyncio.to_thread(stop_thread), allocated)

            def drop() -> None:
                old._model = None

            await piece(client, "drop the model", lambda: asyncio.to_thread(drop), allocated)
            await piece(client, "gc.collect()", lambda: asyncio.to_thread(gc.collect), allocated)
            await piece(
                client,
                "empty_cache()",
                lambda: asyncio.to_thread(torch.cuda.empty_cache),
                allocated,
            )
            await piece(
                client, "gc.collect() again", lambda: asyncio.to_thread(gc.collect), allocated
            )
            print("the engine's own close(), another engine the same way:")
            await piece(client, "cold.close()", cold.close, allocated)
            baseline_spans = [e - s for s, e in client.spans]
        print(f"client requests in all: n={len(baseline_spans)}, median "
              f"{statistics.median(baseline_spans) * 1000:.1f} ms")  # fmt: skip
        await warm.close()
        await old.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def profile_next_generation(engine: TorchEngine) -> None:
    """Run the engine's next generation job under cProfile (on its own thread); print the top."""
    original = engine.run_job

    def profiled(job: Any) -> Any:
        if job.kind != "generate":
            return original(job)
        engine.run_job = original  # type: ignore[method-assign]
        profiler = cProfile.Profile()
        profiler.enable()
        try:
            return original(job)
        finally:
            profiler.disable()
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
            print("first generation after the probe, cProfile by own time:")
            print(out.getvalue()[-6000:])

    engine.run_job = profiled  # type: ignore[method-assign]


def _stop_job(engine: TorchEngine) -> Any:
    from chainrt.engines._bridge import EngineJob
    from chainrt.engines._threaded import _STOP_PRIORITY

    return EngineJob(_STOP_PRIORITY, next(engine._seq), "stop")


def main() -> int:
    """Parse the arguments and run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--profile", action="store_true", help="cProfile the first generation")
    asyncio.run(main_async(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
