"""The torch worker *service* on a GPU: concurrent clients, a real CUDA OOM, readiness over HTTP.

    python bench/gpu_worker.py --random-model            # on a CUDA host: real OOM, HTTP figures
    python bench/gpu_worker.py --random-model --dry-run  # anywhere: OOM injected at the engine

What it does: starts ``chainrt-worker serve --engine torch`` (a real process, uvicorn, admission,
readiness, metrics) and sends it small chat completions from ``--clients`` concurrent clients (the
official ``openai`` client, no client-side retries) for the whole run. On a GPU it then fills the
device with ballast tensors held by *this* process (another tenant of the GPU, as far as the worker
knows) until ``--margin-mb`` is free, and, ``--episodes`` times, sends one request whose prompt's
KV cache is sized to pass admission (``--fill`` of the free memory) but whose prefill needs more
than is free: the worker hits a real ``torch.OutOfMemoryError``, answers that request 503, recovers
in process and serves again. A poller reads ``/health/ready`` every 10 ms throughout.

It prints, per episode, what the oversized request got and the time from its error response to the
worker's ``/health/ready`` answering 200 again (service-level: over HTTP), and in total how many
small requests succeeded and failed, and how long readiness was ever false. With ``--dry-run`` the
OOM is injected inside the engine through ``/admin/faults`` (no ballast, CPU or GPU): the figures
then say the HTTP path works, nothing about a GPU, and they are labelled so.

Needs torch, transformers, the worker extra (starlette, uvicorn, pydantic, prometheus-client) and
``openai``; on a bare GPU host carry them as wheels (docs/vllm.md, "GPU runs").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import httpx  # noqa: E402
from gpu_oom import build_random_model, fill_ballast  # noqa: E402

SERVED = "gpu-bench"
GOAL_READY_S = 0.5


@dataclass
class Episode:
    """One oversized request and what followed it."""

    status: int
    """HTTP status the oversized request got (503 for an OOM the worker recovered from)."""
    error: str
    prompt_tokens: int
    ready_again_s: float
    """From the oversized request's error response to /health/ready answering 200 again."""


@dataclass
class Report:
    """What the bench prints (and writes with --json)."""

    device: str
    mode: str
    model: str
    clients: int
    margin_mb: float = 0.0
    episodes: list[Episode] = field(default_factory=list)
    small_ok: int = 0
    small_failed: int = 0
    small_errors: dict[str, int] = field(default_factory=dict)
    small_latency_p50_s: float = 0.0
    small_latency_p99_s: float = 0.0
    not_ready_total_s: float = 0.0
    worker_oom_events: float = 0.0
    worker_recovery_seconds_sum: float = 0.0


class Worker:
    """One ``python -m workers.cli serve --engine torch`` process on a free port."""

    def __init__(self, model_dir: Path, *, dry_run: bool) -> None:
        from chainrt.testing.redis_server import free_port

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        argv = [
            sys.executable, "-m", "workers.cli", "serve", "--engine", "torch",
            "--model", str(model_dir), "--served-model-name", SERVED, "--port", str(self.port),
            "--max-model-len", "131072", "--health-interval", "600", "--log-level", "warning",
            # Admission compares KV estimates with free memory; at 1.0 it lets through a request
            # whose estimate fits what is free, so that the engine meets the real shortfall.
            "--watermark", "1.0",
        ]  # fmt: skip
        if dry_run:
            argv.append("--enable-fault-injection")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH")] if p)
        self.log = tempfile.NamedTemporaryFile(prefix="gpu-worker-", suffix=".log")  # noqa: SIM115
        self.process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self.log, stderr=self.log)

    def wait_ready(self, timeout_s: float) -> None:
        """Wait for /health/ready; the log's tail in the error if the process died."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"worker exited:\n{Path(self.log.name).read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.base}/health/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise SystemExit(f"worker not ready after {timeout_s:.0f} s")

    def metric(self, name: str) -> float:
        """Sum of one Prometheus metric's samples (labels ignored)."""
        text = httpx.get(f"{self.base}/metrics", timeout=5).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and line[len(name)] in " {"
        )

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


class Load:
    """Small chat completions from concurrent clients, and a /health/ready poller."""

    def __init__(self, worker: Worker, clients: int) -> None:
        import openai

        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.errors: dict[str, int] = {}
        self.not_ready: list[tuple[float, float]] = []
        self._clients = [
            openai.OpenAI(base_url=f"{worker.base}/v1", api_key="unused", max_retries=0)
            for _ in range(clients)
        ]
        self._base = worker.base
        self._threads = [threading.Thread(target=self._client, args=(c, i)) for i, c in
                         enumerate(self._clients)]  # fmt: skip
        self._threads.append(threading.Thread(target=self._poll_ready))

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join()

    def _client(self, client: Any, index: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            started = time.monotonic()
            try:
                client.chat.completions.create(
                    model=SERVED,
                    messages=[{"role": "user", "content": f"client {index} request {n}"}],
                    max_tokens=4,
                    timeout=60,
                )
            except Exception as exc:
                key = f"{type(exc).__name__} {getattr(exc, 'status_code', '')}".strip()
                with self.lock:
                    self.errors[key] = self.errors.get(key, 0) + 1
                print(f"  small request failed: {key}: {str(exc)[:160]}", flush=True)
                continue
            with self.lock:
                self.latencies.append(time.monotonic() - started)

    def _poll_ready(self) -> None:
        with httpx.Client(timeout=5) as http:
            down_since: float | None = None
            while not self.stop.is_set():
                now = time.monotonic()
                try:
                    ready = http.get(f"{self._base}/health/ready").status_code == 200
                except httpx.HTTPError:
                    ready = False
                if not ready and down_since is None:
                    down_since = now
                elif ready and down_since is not None:
                    self.not_ready.append((down_since, now))
                    down_since = None
                time.sleep(0.01)


def wait_ready_after(base: str, since: float) -> float:
    """Seconds from ``since`` until /health/ready answers 200 (polled every 5 ms)."""
    with httpx.Client(timeout=5) as http:
        while True:
            try:
                if http.get(f"{base}/health/ready").status_code == 200:
                    return time.monotonic() - since
            except httpx.HTTPError:
                pass
            if time.monotonic() - since > 120:
                return float("inf")
            time.sleep(0.005)


def oversized(worker: Worker, tokens: int, *, dry_run: bool) -> Episode:
    """Send one request with a ``tokens``-token prompt (byte-level model: a byte a token)."""
    if dry_run:
        httpx.post(f"{worker.base}/admin/faults", json={"oom": 1}, timeout=5).raise_for_status()
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": "x" * tokens}],
        "max_tokens": 1,
    }
    response = httpx.post(f"{worker.base}/v1/chat/completions", json=body, timeout=120)
    answered = time.monotonic()
    ready_s = wait_ready_after(worker.base, answered)
    try:
        error = str(response.json().get("error", {}).get("message", ""))[:200]
    except ValueError:
        error = response.text[:200]
    return Episode(response.status_code, error or "no error", tokens, round(ready_s, 4))


def run(args: argparse.Namespace) -> Report:
    """Start the worker, run the load and the episodes, and collect the figures."""
    import torch

    gpu = torch.cuda.is_available()
    if not gpu and not args.dry_run:
        raise SystemExit("no CUDA device: run on a GPU host, or pass --dry-run (injected OOM)")
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = build_random_model(Path(scratch) / "random-llama")
        report = Report(
            device=torch.cuda.get_device_name(0) if gpu else "cpu",
            mode="injected OOM (dry run)" if args.dry_run else "real CUDA OOM",
            model="random Llama (8 layers, hidden 512, 16 KiB KV/token)",
            clients=args.clients,
        )
        worker = Worker(model_dir, dry_run=args.dry_run)
        try:
            worker.wait_ready(args.start_timeout)
            return drive(worker, torch, report, args)
        finally:
            worker.stop()


def drive(worker: Worker, torch: Any, report: Report, args: argparse.Namespace) -> Report:
    """Load, ballast, episodes; the ballast is freed on the way out."""
    ballast: list[Any] = []
    tokens = 64
    with Load(worker, args.clients) as load:
        time.sleep(args.warmup_s)
        if not args.dry_run:
            ballast = fill_ballast(torch, "cuda", args.margin_mb << 20)
            free = torch.cuda.mem_get_info()[0]
            report.margin_mb = round(free / 2**20, 1)
            tokens = min(131000, int(free * args.fill) // (16 << 10))
        print(
            f"gpu_worker: {report.device}, {report.mode}, ballast "
            f"{sum(b.numel() for b in ballast) / 2**30:.1f} GiB, free {report.margin_mb} MiB, "
            f"oversized prompt {tokens} tokens, {args.clients} clients",
            flush=True,
        )
        try:
            for n in range(1, args.episodes + 1):
                time.sleep(args.gap_s)
                episode = oversized(worker, tokens, dry_run=args.dry_run)
                report.episodes.append(episode)
                print(
                    f"episode {n}: HTTP {episode.status} ({episode.error[:90]}); ready again "
                    f"{episode.ready_again_s:.4f} s after the error response",
                    flush=True,
                )
            time.sleep(args.gap_s)
        finally:
            ballast.clear()
            if not args.dry_run:
                torch.cuda.empty_cache()
    latencies = sorted(load.latencies)
    report.small_ok = len(latencies)
    report.small_failed = sum(load.errors.values())
    report.small_errors = dict(load.errors)
    if latencies:
        report.small_latency_p50_s = round(statistics.median(latencies), 4)
        report.small_latency_p99_s = round(latencies[int(0.99 * (len(latencies) - 1))], 4)
    report.not_ready_total_s = round(sum(end - start for start, end in load.not_ready), 4)
    report.worker_oom_events = worker.metric("chainrt_worker_oom_events_total")
    report.worker_recovery_seconds_sum = round(
        worker.metric("chainrt_worker_recovery_seconds_sum"), 4
    )
    return report


def summary(report: Report) -> dict[str, Any]:
    """The headline figures."""
    ready = [e.ready_again_s for e in report.episodes if e.status == 503]
    return {
        "level": "service (HTTP /health/ready after the 503)",
        "dry_run": report.mode.startswith("injected"),
        "oom_503": f"{sum(e.status == 503 for e in report.episodes)}/{len(report.episodes)}",
        "ready_again_p50_s": round(statistics.median(ready), 4) if ready else None,
        "ready_again_max_s": max(ready) if ready else None,
        "goal_s": GOAL_READY_S,
        "small_ok": report.small_ok,
        "small_failed": report.small_failed,
        "small_p50_s": report.small_latency_p50_s,
        "small_p99_s": report.small_latency_p99_s,
        "readiness_false_total_s": report.not_ready_total_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--random-model", action="store_true", required=True,
                        help="serve a random-weights Llama built here (nothing to download)")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="inject the OOM (no ballast)")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--margin-mb", type=int, default=1024, help="GPU memory left free")
    parser.add_argument("--fill", type=float, default=0.9,
                        help="oversized prompt's KV estimate as a share of free memory")  # fmt: skip
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--gap-s", type=float, default=3.0, help="load between episodes")
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    report = run(args)
    headline = summary(report)
    print(json.dumps(headline, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"summary": headline, **asdict(report)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
