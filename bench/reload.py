"""Hot reload under load: latency before and after, failures, readiness.

    .venv/bin/python bench/reload.py [--clients 4] [--seconds 20] [--max-tokens 8]
    python bench/reload.py --engine torch --random-model     # a GPU host (or slowly, the CPU)

Starts a real worker (``--served-model-name v1 --admin-token ...``), runs ``--clients`` threads
each sending chat requests back to back with the official ``openai`` client, polls
``/health/ready`` every 50 ms, and half-way through posts ``/admin/reload`` to a copy of the model
(local engine: a copy of the GGUF under another file name; torch engine: a copy of a random-weights
Llama's HF folder, built here as in ``bench/gpu_oom.py``) served as ``v2``. Prints p50/p99 of the
requests that ended before the reload was asked for and of those that started after it answered,
the requests answered during the reload, the failures, the readiness answers that were not 200,
and the reload's own timing. Figures are what this machine did in this run.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import httpx  # noqa: E402
from _workers import BenchWorker  # noqa: E402
from openai import OpenAI  # noqa: E402
from openai.types.chat import ChatCompletionMessageParam  # noqa: E402

from workers.engines import resolve_model_path  # noqa: E402

TOKEN = "bench-reload-token-0123456789"


@dataclass
class Seen:
    """Per request: (start, end, model that answered); failures; readiness answers not 200."""

    answers: list[tuple[float, float, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    not_ready: int = 0
    ready_polls: int = 0
    stop: threading.Event = field(default_factory=threading.Event)


def client_loop(base: str, seen: Seen, max_tokens: int) -> None:
    """Ask back to back until told to stop."""
    ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name a color."}]
    with OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        while not seen.stop.is_set():
            started = time.monotonic()
            try:
                answer = client.chat.completions.create(
                    model="v1",
                    messages=ask,
                    max_tokens=max_tokens,
                    temperature=0,
                )
            except Exception as exc:  # counted and printed
                seen.failures.append(f"{type(exc).__name__}: {exc}")
                continue
            seen.answers.append((started, time.monotonic(), answer.model))


def poll_ready(base: str, seen: Seen) -> None:
    """GET /health/ready every 50 ms."""
    with httpx.Client(base_url=base, timeout=30) as http:
        while not seen.stop.is_set():
            seen.ready_polls += 1
            if http.get("/health/ready").status_code != 200:
                seen.not_ready += 1
            time.sleep(0.05)


def quantiles(latencies: list[float]) -> str:
    """``n=…, p50=… ms, p99=… ms``."""
    if len(latencies) < 2:
        return f"n={len(latencies)} (too few for percentiles)"
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return f"n={len(latencies)}, p50={cuts[49] * 1000:.0f} ms, p99={cuts[98] * 1000:.0f} ms"


def main() -> int:
    """Run the benchmark; exit 1 when a request failed or readiness dropped."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--engine", choices=["local", "torch"], default="local")
    parser.add_argument(
        "--random-model", action="store_true", help="torch: serve a random-weights Llama built here"
    )
    args = parser.parse_args()
    if args.engine == "torch" and not args.random_model:
        parser.error("--engine torch needs --random-model (nothing is downloaded)")
    folder = Path(tempfile.mkdtemp(prefix="chainrt-reload-"))
    if args.engine == "local":
        engine = ["--engine", "local"]
        copy = folder / "model-v2.gguf"
        shutil.copyfile(resolve_model_path(), copy)
    else:
        from gpu_oom import build_random_model

        first = build_random_model(folder / "v1")
        copy = folder / "v2"
        shutil.copytree(first, copy)
        engine = ["--engine", "torch", "--model", str(first)]
    worker = BenchWorker(
        *engine, "--served-model-name", "v1", "--admin-token", TOKEN, "--log-level", "warning",
    )  # fmt: skip
    seen = Seen()
    try:
        worker.start()
        threads = [
            threading.Thread(target=client_loop, args=(worker.base, seen, args.max_tokens))
            for _ in range(args.clients)
        ]
        threads.append(threading.Thread(target=poll_ready, args=(worker.base, seen)))
        for thread in threads:
            thread.start()
        time.sleep(args.seconds / 2)
        asked = time.monotonic()
        answer = httpx.post(
            f"{worker.base}/admin/reload",
            json={"model": str(copy), "served_model_name": "v2"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=300,
        )
        swapped = time.monotonic()
        time.sleep(args.seconds / 2)
        seen.stop.set()
        for thread in threads:
            thread.join(300)
    finally:
        seen.stop.set()
        worker.stop()
        shutil.rmtree(folder, ignore_errors=True)
    before = [end - start for start, end, _ in seen.answers if end < asked]
    after = [end - start for start, end, _ in seen.answers if start > swapped]
    models_after = sorted({m for start, _, m in seen.answers if start > swapped})
    during = [a for a in seen.answers if not (a[1] < asked or a[0] > swapped)]
    print(
        f"engine={args.engine} clients={args.clients} seconds={args.seconds} "
        f"max_tokens={args.max_tokens}"
    )
    print(f"reload: HTTP {answer.status_code} in {swapped - asked:.2f} s: {answer.text}")
    print(f"before the reload: {quantiles(before)}")
    print(f"after the reload:  {quantiles(after)} (answered by {', '.join(models_after)})")
    print(f"in flight across the reload: {len(during)} answered")
    print(f"failed requests: {len(seen.failures)}")
    for failure in seen.failures[:5]:
        print(f"  {failure}")
    print(f"readiness polls: {seen.ready_polls}, not ready: {seen.not_ready}")
    if len(before) > 1 and len(after) > 1:
        p99 = [statistics.quantiles(x, n=100, method="inclusive")[98] for x in (before, after)]
        print(f"p99 change after/before: {100 * (p99[1] / p99[0] - 1):+.1f} %")
    ok = answer.status_code == 200 and not seen.failures and seen.not_ready == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
