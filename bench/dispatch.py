"""Latency added by dispatch, against calling the same endpoint directly with httpx.

    .venv/bin/python bench/dispatch.py [--n 3000] [--target stub|worker]

``--target stub`` (default) serves a canned completion from a minimal Starlette/uvicorn server
(bench/_stub_openai.py) in its own process: the endpoint does no work, so the difference between
the two paths is the router's own cost — endpoint choice, breakers, retry policy (tenacity),
attempt log, span hooks, headers, JSON in and out. ``--target worker`` uses a real chainrt worker
(local engine, max_tokens=1) instead; its generation time makes the figure noisier.

Both paths send the same body over one pooled ``httpx.AsyncClient`` with keep-alive; they run in
alternating blocks so that drift in machine load hits both alike. Goal: added p50 <= 0.5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _workers import local_workers, pct, percentiles, stub_server  # noqa: E402

from chainrt.dispatch import (  # noqa: E402
    BackendAnswer,
    Dispatcher,
    LlmCall,
    ModelBackend,
    TextSink,
    make_dispatcher,
    parse_pool_config,
)

MESSAGES = [("user", "Say OK")]
BLOCK = 200


@contextlib.contextmanager
def _worker() -> Iterator[str]:
    with local_workers(1, "--health-interval", "600", served="stub") as workers:
        yield workers[0].base


class _InstantBackend(ModelBackend):
    """Answers at once without I/O: isolates the dispatch loop's own CPU cost."""

    def available(self) -> bool:
        return True

    async def complete(
        self,
        call: LlmCall,
        model: str,
        max_tokens: int,
        deadline: float,
        *,
        avoid: frozenset[str] = frozenset(),
        on_text: TextSink | None = None,
    ) -> BackendAnswer:
        if on_text is not None:
            on_text("OK")
        return BackendAnswer("OK", "stop", 5, 1, endpoint="in-process")


async def _timed(fn: Callable[[], Awaitable[object]], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


async def _bench(url: str, n: int, target: str) -> None:
    pool = parse_pool_config(
        f"models:\n  primary:\n    served_model: stub\n    endpoints: [{{url: '{url}'}}]\n"
    )
    dispatcher = make_dispatcher(pool)
    instant = Dispatcher({"primary": _InstantBackend()})
    call = LlmCall(model="primary", messages=MESSAGES, max_tokens=1, run_id="bench", step_id="s")
    body = json.dumps(
        {
            "model": "stub",
            "messages": [{"role": "user", "content": "Say OK"}],
            "max_tokens": 1,
            "temperature": 0.0,
        },
        separators=(",", ":"),
    ).encode()
    client = httpx.AsyncClient(timeout=10)

    async def direct() -> object:
        headers = {
            "Content-Type": "application/json",
            "X-Chainrt-Deadline": str(int((time.time() + 5) * 1000)),
            "X-Priority": "normal",
        }
        response = await client.post(f"{url}/v1/chat/completions", content=body, headers=headers)
        response.raise_for_status()
        data = json.loads(response.content)
        return data["choices"][0]["message"]["content"]

    async def dispatched() -> object:
        return (await dispatcher.complete(call, time.time() + 5)).text

    async def loop_only() -> object:
        return (await instant.complete(call, time.time() + 5)).text

    try:
        await _timed(direct, BLOCK)  # warm-up: connections, imports, caches
        await _timed(dispatched, BLOCK)
        direct_ms: list[float] = []
        dispatch_ms: list[float] = []
        for _ in range(max(1, n // BLOCK)):
            direct_ms += await _timed(direct, BLOCK)
            dispatch_ms += await _timed(dispatched, BLOCK)
        loop_ms = await _timed(loop_only, n)
    finally:
        await client.aclose()
        await dispatcher.close()
    d50, r50 = pct(direct_ms, 0.5), pct(dispatch_ms, 0.5)
    print(f"target           {target} at {url}")
    print(
        f"requests         {len(direct_ms)} direct, {len(dispatch_ms)} dispatched (alternating blocks of {BLOCK})"
    )
    print(f"direct httpx     {percentiles(direct_ms, width=0)}")
    print(f"via dispatch     {percentiles(dispatch_ms, width=0)}")
    print(
        f"added by dispatch  p50 {r50 - d50:+.3f} ms   (goal <= 0.5 ms)   mean {statistics.fmean(dispatch_ms) - statistics.fmean(direct_ms):+.3f} ms"
    )
    print(f"dispatch loop alone (no I/O backend)  {percentiles(loop_ms, width=0)}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=3000, help="requests per path")
    parser.add_argument("--target", choices=["stub", "worker"], default="stub")
    args = parser.parse_args()
    with stub_server() if args.target == "stub" else _worker() as url:
        asyncio.run(_bench(url, args.n, args.target))


if __name__ == "__main__":
    main()
