"""``bench/serve.py --ttft``: a streaming LLM step's first token, through ``chainrt serve`` and in
process (issue 39).

One chain, one LLM step (``max_tokens`` ``--max-tokens``), its model served by ``--target``:

* ``worker`` (default): one real ``chainrt-worker`` process (``python -m workers.cli serve
  --engine local``: SmolLM2-135M on llama.cpp, on this machine's CPU), as the fleet runs one;
* ``stub``: ``bench/_stub_openai.py``, whose stream costs nothing (its first content chunk comes
  at once, or after ``--stub-delay-ms``), so that the difference is the service path's alone.
  With no delay the whole run may end before the client's SSE stream opens: such a stream has
  no ``token`` events (they are not recorded), and its first text is ``run_finished``'s output
  (the count is printed); a delay of 20 ms keeps the step running until the stream is open.

The same private redis-server (AOF, fsync every second, unless ``--no-persistence``) is the store
of both sides:

* in process: ``Runtime.stream(chain, {})``: from the call to the first ``token`` event;
* through the service: a ``chainrt serve`` on that Redis with the same pool: ``POST /v1/runs``,
  then ``GET /v1/runs/{id}/events`` (SSE, docs/serve.md "Run events"): from the ``POST`` sent to
  the first ``event: token`` read off the stream (what a client sees).

The two take turns run by run (``--n`` of each after 5 warm-up pairs), so a loaded machine's drift
falls on both alike. Printed: p50 / p99 each way, the difference of the p50s (goal: through the
service within +5 ms p50), the median of the paired differences, and where the served first
token's time goes: up to the token event's own ``ts`` (made on the runner: submit, queue, take,
run start, the step, the engine's first token; same host, same clock) and from it to the client
(Redis pub/sub, the server's SSE, HTTP).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import chainrt
from chainrt._runtime import Runtime
from chainrt.spec import spec_from_dict
from chainrt.testing.serve_process import ServeProcess

__all__ = ["add_ttft_flags", "ttft"]


def add_ttft_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--ttft`` and its options to bench/serve.py's arguments."""
    parser.add_argument(
        "--ttft",
        action="store_true",
        help="time to first token of a streaming LLM step, through the server's SSE and in process",
    )
    parser.add_argument("--n", type=int, default=200, help="--ttft: runs each way")
    parser.add_argument(
        "--target", choices=("worker", "stub"), default="worker", help="--ttft: the model's server"
    )
    parser.add_argument("--max-tokens", type=int, default=4, help="--ttft: the step's max_tokens")
    parser.add_argument(
        "--stub-delay-ms",
        type=float,
        default=0.0,
        help="--ttft --target stub: the stub waits this long before it answers (its 'first "
        "token'), so that the step is still running when the SSE stream opens",
    )


def _chain(max_tokens: int) -> dict[str, object]:
    return {
        "name": "gen",
        "description": "One streaming LLM step (bench/serve.py --ttft)",
        "budget": "30s",
        "steps": [
            {
                "id": "gen",
                "llm": {"model": "smol", "prompt": "Say hi.", "max_tokens": max_tokens},
            }
        ],
    }


@contextlib.contextmanager
def _target(kind: str, delay_ms: float) -> Iterator[str]:
    from _workers import local_workers, stub_server

    if kind == "stub":
        with stub_server("--delay-ms", str(delay_ms)) as url:
            yield url
    else:
        with local_workers(1, "--health-interval", "300", served="smol") as workers:
            yield workers[0].base


def ms(t: tuple[float, float, float]) -> float:
    """From the call (or POST) to the first text read, in ms."""
    return (t[2] - t[0]) * 1e3


def made(t: tuple[float, float, float]) -> float:
    """From the call (or POST) to the first token event's own ``ts``, in ms."""
    return (t[1] - t[0]) * 1e3


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _served_first_token(c: httpx.AsyncClient, run_id: str) -> tuple[float, float, float]:
    """(POST sent, token event's ts, token read) in epoch seconds; the stream is read to its end.

    A stream that opens after the step has ended carries no ``token`` events (a finished step's
    tokens are not recorded, docs/serve.md "Run events"): its first text is then the output of
    ``run_finished``, and the token's ``ts`` is NaN (counted and printed)."""
    sent = time.time()
    posted = await c.post("/v1/runs", json={"chain": "gen", "input": {}, "run_id": run_id})
    assert posted.status_code == 202, posted.text
    made = got = float("nan")
    async with c.stream("GET", f"/v1/runs/{run_id}/events") as stream:
        assert stream.status_code == 200, await stream.aread()
        event = ""
        async for line in stream.aiter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event == "token" and got != got:
                got = time.time()
                made = float(json.loads(line[5:])["ts"])
            elif line.startswith("data:") and event == "run_finished":
                finished = json.loads(line[5:])
                assert finished.get("status") == "completed", line
                if got != got:  # the step had ended before the stream opened: no token events
                    got, made = time.time(), float("nan")
    return sent, made, got


async def _local_first_token(rt: Runtime, chain: chainrt.Chain) -> tuple[float, float, float]:
    """(call, token event's ts, token yielded) in epoch seconds; the run is read to its end."""
    called = time.time()
    made = got = float("nan")
    async for event in rt.stream(chain, {}):
        if event.type == "token" and got != got:
            got = time.time()
            made = event.ts
        elif event.type == "run_finished":
            assert event.data["status"] == "completed", event.data
    assert got == got, "no token event in process"
    return called, made, got


async def _pairs(url: str, server: str, pool: Path, folder: Path, args: argparse.Namespace) -> None:
    chain = chainrt.Chain(spec_from_dict(_chain(args.max_tokens)), source_dir=folder)
    local: list[tuple[float, float, float]] = []
    served: list[tuple[float, float, float]] = []
    async with (
        Runtime(store=url, pool=str(pool)) as rt,
        httpx.AsyncClient(base_url=server, timeout=60) as c,
    ):
        for i in range(-5, args.n):
            one = await _local_first_token(rt, chain)
            two = await _served_first_token(c, f"ttft-{i + 5}")
            if i >= 0:
                local.append(one)
                served.append(two)
    missed = sum(1 for t in served if t[1] != t[1])
    lw, sw = [ms(t) for t in local], [ms(t) for t in served]
    diffs = [s - lo for s, lo in zip(sw, lw, strict=True)]
    lp, sp = statistics.median(lw), statistics.median(sw)
    print(f"\nfirst token, {args.n} runs each way, taking turns (ms):")
    print(f"  in process (Runtime.stream)          p50 {lp:7.2f}  p99 {_pct(lw, 0.99):7.2f}")
    print(f"  through chainrt serve (POST + SSE)   p50 {sp:7.2f}  p99 {_pct(sw, 0.99):7.2f}")
    print(
        f"  difference of the p50s {sp - lp:+.2f} ms (goal: <= +5 ms); median of the paired "
        f"differences {statistics.median(diffs):+.2f} ms; p99 difference "
        f"{_pct(sw, 0.99) - _pct(lw, 0.99):+.2f} ms"
    )
    print("where the first token's time goes (p50, ms):")
    print(
        f"  in process: call -> token made {statistics.median(made(t) for t in local):7.2f}; "
        f"made -> yielded {statistics.median((t[2] - t[1]) * 1e3 for t in local):7.2f}"
    )
    streamed = [t for t in served if t[1] == t[1]]
    if streamed:
        print(
            f"  served:     POST sent -> token made on the runner "
            f"{statistics.median(made(t) for t in streamed):7.2f}; made -> read off the SSE "
            f"{statistics.median((t[2] - t[1]) * 1e3 for t in streamed):7.2f}"
        )
    print(
        f"  served runs whose stream opened after the step had ended (no token events; first "
        f"text = run_finished's output): {missed} of {len(served)}"
    )


def ttft(args: argparse.Namespace) -> None:
    """The TTFT comparison (see the module docstring)."""
    from _redis import persistence_label, private_server

    with tempfile.TemporaryDirectory() as tmp, _target(args.target, args.stub_delay_ms) as target:
        root = Path(tmp)
        folder = root / "chains"
        folder.mkdir()
        (folder / "gen.yaml").write_text(yaml.safe_dump(_chain(args.max_tokens), sort_keys=False))
        served_model = "stub" if args.target == "stub" else "smol"
        pool = root / "pool.yaml"
        pool.write_text(
            yaml.safe_dump(
                {"models": {"smol": {"served_model": served_model, "endpoints": [{"url": target}]}}}
            )
        )
        what = (
            f"bench/_stub_openai.py (no work; it answers after {args.stub_delay_ms:g} ms, "
            "then streams its chunks at once)"
            if args.target == "stub"
            else "one chainrt-worker process, --engine local (SmolLM2-135M on llama.cpp, CPU)"
        )
        print(
            f"TTFT: one LLM step, max_tokens {args.max_tokens}, model served by {what} at "
            f"{target}; {persistence_label(args)}; {os.cpu_count()} CPU cores; load average "
            f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
            f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
            flush=True,
        )
        with (
            private_server(args) as redis,
            ServeProcess(
                store=redis.url, chains=folder, max_runs=16, args=["--pool", str(pool)]
            ) as server,
        ):
            asyncio.run(_pairs(redis.url, server.url, pool, folder, args))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
