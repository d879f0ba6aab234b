"""vLLM engine-core death under load: time to the new core's first answer, failures, breakdown.

    flock /tmp/chainrt-heavy.lock .venv/bin/python bench/vllm_recovery.py [--episodes 5]
        [--clients 4] [--max-tokens 8]

Starts a real ``chainrt-worker serve --engine vllm`` and runs ``--clients`` threads sending chat
requests back to back with the official ``openai`` client (no retries: every error counts), while
``/health/ready`` is polled every 50 ms. Each episode SIGKILLs the worker's ``VLLM::EngineCore``
child process and measures: death → first successful answer of a request sent after the death,
death → readiness back, requests failed (by HTTP status, with the ``Retry-After`` they carried)
and requests served between the death and readiness back. At the end it prints p50/max over the
episodes and, from the worker's log, where each rebuild's time went (old core shut down, new
engine core built — vLLM's own "Model loading took" and "init engine" lines split that — and the
first token). Figures are what this machine did in this run.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import httpx  # noqa: E402
import openai  # noqa: E402
import psutil  # noqa: E402
from _workers import BenchWorker  # noqa: E402
from openai.types.chat import ChatCompletionMessageParam  # noqa: E402


@dataclass
class Seen:
    """Successes (start, end), failures (time, status, Retry-After), readiness samples."""

    ok: list[tuple[float, float]] = field(default_factory=list)
    failed: list[tuple[float, int, str]] = field(default_factory=list)
    ready: list[tuple[float, bool]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


def client_loop(base: str, seen: Seen, max_tokens: int) -> None:
    """Ask back to back until told to stop."""
    ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name a color."}]
    with openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=120) as client:
        while not seen.stop.is_set():
            started = time.monotonic()
            try:
                client.chat.completions.create(
                    model="smol", messages=ask, max_tokens=max_tokens, temperature=0
                )
            except openai.APIStatusError as exc:
                wait = exc.response.headers.get("retry-after", "-")
                seen.failed.append((time.monotonic(), exc.status_code, wait))
                time.sleep(0.05)
                continue
            except openai.APIError as exc:
                seen.failed.append((time.monotonic(), 0, type(exc).__name__))
                time.sleep(0.05)
                continue
            seen.ok.append((started, time.monotonic()))


def poll_ready(base: str, seen: Seen) -> None:
    """GET /health/ready every 50 ms."""
    with httpx.Client(base_url=base, timeout=30) as http:
        while not seen.stop.is_set():
            try:
                up = http.get("/health/ready").status_code == 200
            except httpx.HTTPError:
                up = False
            seen.ready.append((time.monotonic(), up))
            time.sleep(0.05)


def engine_core(pid: int) -> psutil.Process:
    """The worker's ``VLLM::EngineCore`` child."""
    for child in psutil.Process(pid).children(recursive=True):
        if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name():
            return child
    raise RuntimeError(f"worker {pid} has no VLLM::EngineCore child")


def episode(worker: BenchWorker, seen: Seen, timeout_s: float) -> dict[str, float | str]:
    """Kill the engine core once; wait for an answer after it and for readiness."""
    assert worker.process is not None
    core = engine_core(worker.process.pid)
    died = time.monotonic()
    os.kill(core.pid, signal.SIGKILL)
    first = back = None
    while time.monotonic() - died < timeout_s:
        time.sleep(0.05)
        if first is None:
            first = next((end for start, end in seen.ok if start > died), None)
        if back is None:
            down = [t for t, up in seen.ready if t > died and not up]
            if down:
                back = next((t for t, up in seen.ready if t > down[0] and up), None)
        if first is not None and back is not None:
            break
    if first is None or back is None:
        raise RuntimeError(f"no recovery within {timeout_s}s")
    fails = [f for f in seen.failed if died <= f[0] <= back]
    statuses = sorted({f"{status}(Retry-After {wait})" for _, status, wait in fails})
    served = sum(1 for _, end in seen.ok if died < end < back)
    return {
        "first_answer_s": first - died,
        "ready_s": back - died,
        "failed": len(fails),
        "served": served,
        "statuses": ", ".join(statuses) or "-",
    }


def breakdown(log: str) -> list[str]:
    """The rebuild lines of the worker's log (ours and vLLM's own timings)."""
    wanted = re.compile(r"vLLM rebuild:|Model loading took|init engine \(|recovered from")
    return [line.strip()[-160:] for line in log.splitlines() if wanted.search(line)]


def main() -> int:
    """Run the episodes; exit 1 when an episode did not recover."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds between episodes")
    args = parser.parse_args()
    worker = BenchWorker("--engine", "vllm", "--served-model-name", "smol")
    seen = Seen()
    results: list[dict[str, float | str]] = []
    started = time.monotonic()
    threads: list[threading.Thread] = []
    try:
        worker.start(timeout_s=400)
        print(f"worker ready in {time.monotonic() - started:.1f} s", flush=True)
        threads = [
            threading.Thread(target=client_loop, args=(worker.base, seen, args.max_tokens))
            for _ in range(args.clients)
        ]
        threads.append(threading.Thread(target=poll_ready, args=(worker.base, seen)))
        for thread in threads:
            thread.start()
        for number in range(1, args.episodes + 1):
            time.sleep(args.settle)
            result = episode(worker, seen, timeout_s=300)
            results.append(result)
            print(
                f"episode {number}: death -> first answer {result['first_answer_s']:.2f} s, "
                f"-> ready {result['ready_s']:.2f} s; failed {result['failed']} "
                f"[{result['statuses']}]; served during recovery {result['served']}",
                flush=True,
            )
    finally:
        seen.stop.set()
        for thread in threads:
            thread.join(120)
        log = Path(worker._log.name).read_text(errors="replace") if worker.process else ""
        worker.stop()
    firsts = [float(r["first_answer_s"]) for r in results]
    if firsts:
        print(
            f"summary: {len(results)} episodes, {args.clients} clients; death -> first answer "
            f"p50 {statistics.median(firsts):.2f} s, max {max(firsts):.2f} s; failed "
            f"{sum(int(r['failed']) for r in results)}; answered in total {len(seen.ok)}"
        )
    print("rebuild breakdown (worker log):")
    for line in breakdown(log):
        print(f"  {line}")
    return 0 if len(results) == args.episodes else 1


if __name__ == "__main__":
    sys.exit(main())
