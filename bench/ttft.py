"""Time to first token through dispatch (streaming) against straight to the same worker.

    .venv/bin/python bench/ttft.py [--n 300] [--target worker|stub] [--engine local|torch]
        [--max-tokens 4]

``--target worker`` (default) starts one real chainrt worker (``--engine local``: SmolLM2 on
llama.cpp; ``torch``: the same weights on torch); ``--target stub`` the stub OpenAI server (bench/_stub_openai.py), whose stream costs
nothing, so that the difference is dispatch's alone. Each request streams (``"stream": true``):

* direct — an ``httpx.AsyncClient`` streaming POST with the headers dispatch sends, timed to the
  first non-empty content delta (parsed as dispatch parses it), read to the end of the body as
  the openai client does (so that its connection is reused);
* dispatch — ``Dispatcher.complete`` with ``on_token``, timed to the first call of ``on_token``.

The two alternate request by request (N of each, after a warm-up), so load drift hits both alike.
Printed: p50 / p99 of both, the difference of the p50s, and the median of the paired differences
(each dispatched request minus the direct one just before it). Goal: dispatch adds <= 1 ms p50.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _workers import local_workers, pct, percentiles, stub_server  # noqa: E402

from chainrt.dispatch import LlmCall, make_dispatcher, parse_pool_config  # noqa: E402
from chainrt.dispatch._sse import ChunkReader  # noqa: E402
from chainrt.wire import request_headers  # noqa: E402

WARMUP = 20
PROMPT = "Say OK"


@contextlib.contextmanager
def _target(kind: str, engine: str) -> Iterator[str]:
    if kind == "stub":
        with stub_server() as url:
            yield url
    else:
        extra = ("--health-interval", "600")
        with local_workers(1, *extra, served="stub", engine=engine) as workers:
            yield workers[0].base


async def _bench(url: str, n: int, max_tokens: int, kind: str) -> None:
    pool = parse_pool_config(
        f"models:\n  primary:\n    served_model: stub\n    endpoints: [{{url: '{url}'}}]\n"
        "health: {enabled: false}\n"
    )
    dispatcher = make_dispatcher(pool)
    body = json.dumps(
        {
            "model": "stub",
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        separators=(",", ":"),
    ).encode()
    client = httpx.AsyncClient(timeout=30)

    async def direct() -> float:
        headers = request_headers(deadline_s=time.time() + 30, priority="normal")
        started = time.perf_counter()
        first = None
        async with client.stream(
            "POST", f"{url}/v1/chat/completions", content=body, headers=headers
        ) as response:
            response.raise_for_status()
            reader = ChunkReader(url)
            async for line in response.aiter_lines():  # to the end, as the openai client
                if reader.feed(line) and first is None:  # does: the connection is reused
                    first = time.perf_counter()
        assert first is not None, "no token streamed"
        return (first - started) * 1000

    async def dispatched() -> float:
        first: list[float] = []

        def on_token(text: str) -> None:
            if not first:
                first.append(time.perf_counter())

        call = LlmCall(
            model="primary",
            messages=[("user", PROMPT)],
            max_tokens=max_tokens,
            run_id="bench",
            step_id="s",
            on_token=on_token,
        )
        started = time.perf_counter()
        await dispatcher.complete(call, time.time() + 30)
        assert first, "no token streamed"
        return (first[0] - started) * 1000

    direct_ms: list[float] = []
    dispatch_ms: list[float] = []
    try:
        for _ in range(WARMUP):
            await direct()
            await dispatched()
        for _ in range(n):
            direct_ms.append(await direct())
            dispatch_ms.append(await dispatched())
    finally:
        await client.aclose()
        await dispatcher.close()
    paired = [b - a for a, b in zip(direct_ms, dispatch_ms, strict=True)]
    print(f"target           {kind} at {url}, max_tokens {max_tokens}")
    print(f"requests         {n} direct, {n} dispatched, alternating (after {WARMUP} each)")
    print(f"direct (httpx)   TTFT {percentiles(direct_ms)}")
    print(f"via dispatch     TTFT {percentiles(dispatch_ms)}")
    print(
        f"added by dispatch  p50 {pct(dispatch_ms, 0.5) - pct(direct_ms, 0.5):+.3f} ms   "
        f"median of paired differences {statistics.median(paired):+.3f} ms   (goal <= 1 ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=300, help="requests per path (>= 200)")
    parser.add_argument("--target", choices=["worker", "stub"], default="worker")
    parser.add_argument("--engine", choices=["local", "torch"], default="local")
    parser.add_argument("--max-tokens", type=int, default=4)
    args = parser.parse_args()
    with _target(args.target, args.engine) as url:
        kind = args.target if args.target == "stub" else f"worker ({args.engine} engine)"
        asyncio.run(_bench(url, args.n, args.max_tokens, kind))


if __name__ == "__main__":
    main()
