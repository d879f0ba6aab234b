"""Why a freshly built (standby) vLLM engine core is slow on its first work: time each step.

    flock /tmp/chainrt-heavy.lock .venv/bin/python bench/vllm_first_generation.py
        [--idle 20] [--warm none|probe|serving] [--rounds 2]

Builds one ``VllmEngine`` (one engine core, no standby), then builds a second engine core the way
the standby is built (``VllmEngine._new_llm`` + the standby's warm-up, ``--warm``), leaves it idle
``--idle`` seconds and runs on it, in order, requests of growing novelty, each timed alone:

* ``probe``       1 token of "Hello", no log-probabilities (the standby's build check);
* ``chat-1``      the serving chat prompt, 1 token, no log-probabilities (a new prompt length);
* ``chat-2``      2 tokens (the first decode step);
* ``chat-2-lp``   2 tokens with the top-k log-probabilities the serving path asks for;
* ``chat-8-lp``   8 tokens with log-probabilities (what ``bench/vllm_recovery.py`` asks);
* ``batch-4``     4 of ``chat-8-lp`` at once (the 4 clients);
* ``batch-8``     8 at once, prompts of different lengths.

``--rounds`` repeats the list: round 1 on a cold core against round 2 on the same core shows what
the first time costs and which step pays it. Figures are what this machine did in this run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from chainrt.engines._base import ChatMessage, GenerationRequest  # noqa: E402
from chainrt.engines._vllm import VllmEngine  # noqa: E402
from chainrt.engines._vllm_core import probe_llm  # noqa: E402
from chainrt.engines._vllm_support import shutdown_llm  # noqa: E402


def chat(text: str, tokens: int) -> GenerationRequest:
    """A serving-like chat request (temperature 0)."""
    return GenerationRequest(
        messages=[ChatMessage("user", text)], max_tokens=tokens, temperature=0.0
    )


async def timed_generate(engine: VllmEngine, requests: list[GenerationRequest]) -> float:
    """Seconds for ``requests`` generated at once through the engine's serving path."""
    started = time.perf_counter()
    await asyncio.gather(*(engine.generate(r) for r in requests))
    return time.perf_counter() - started


async def no_logprobs(engine: VllmEngine, llm: Any, text: str, tokens: int) -> float:
    """Seconds for one greedy generation straight on ``llm`` without log-probabilities."""
    v = engine._v
    ids = engine._tokens().prompt_ids(chat(text, tokens), 2048)
    params = v["SamplingParams"](max_tokens=tokens, temperature=0.0)
    started = time.perf_counter()
    async for _ in llm.generate({"prompt_token_ids": ids}, params, f"nolp-{time.time_ns()}"):
        pass
    return time.perf_counter() - started


async def run_steps(engine: VllmEngine, llm: Any) -> list[tuple[str, float]]:
    """The steps of growing novelty, each timed alone."""
    out: list[tuple[str, float]] = []
    hello = engine._tokens().prompt_ids(GenerationRequest(prompt="Hello"), 2048)
    started = time.perf_counter()
    await probe_llm(engine._v, llm, hello)
    out.append(("probe", time.perf_counter() - started))
    out.append(("chat-1", await no_logprobs(engine, llm, "Name a color.", 1)))
    out.append(("chat-2", await no_logprobs(engine, llm, "Name a color.", 2)))
    out.append(("chat-2-lp", await timed_generate(engine, [chat("Name a color.", 2)])))
    out.append(("chat-8-lp", await timed_generate(engine, [chat("Name a color.", 8)])))
    out.append(("batch-4", await timed_generate(engine, [chat("Name a color.", 8)] * 4)))
    mixed = [chat("Name a color. " * (1 + 7 * n), 8) for n in range(8)]
    out.append(("batch-8", await timed_generate(engine, mixed)))
    return out


async def main_async(args: argparse.Namespace) -> None:
    engine = VllmEngine(max_num_seqs=16)
    started = time.perf_counter()
    await engine.start()
    print(f"serving core built in {time.perf_counter() - started:.1f} s", flush=True)
    serving = engine._llm
    started = time.perf_counter()
    spare = await asyncio.to_thread(engine._new_llm)
    print(f"second core built in {time.perf_counter() - started:.1f} s", flush=True)
    hello = engine._tokens().prompt_ids(GenerationRequest(prompt="Hello"), 2048)
    started = time.perf_counter()
    if args.warm == "probe":
        await probe_llm(engine._v, spare, hello)
    elif args.warm == "serving":
        await engine._warm(spare)
    print(f"warm-up ({args.warm}) {time.perf_counter() - started:.2f} s", flush=True)
    await asyncio.sleep(args.idle)
    print(f"idle {args.idle:.0f} s", flush=True)
    engine._llm = spare
    for number in range(1, args.rounds + 1):
        steps = await run_steps(engine, spare)
        line = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in steps)
        print(f"round {number}: {line}", flush=True)
    engine._llm = serving
    await shutdown_llm(spare)
    await engine.close()


def main() -> int:
    """Parse the flags and run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--idle", type=float, default=20.0, help="seconds idle before round 1")
    parser.add_argument("--warm", choices=["none", "probe", "serving"], default="probe")
    parser.add_argument("--rounds", type=int, default=2)
    asyncio.run(main_async(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
