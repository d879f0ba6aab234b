"""vLLM engine-core death under load: time to the new core's first answer, failures, breakdown.

    flock /tmp/chainrt-heavy.lock .venv/bin/python bench/vllm_recovery.py [--episodes 5]
        [--clients 4] [--max-tokens 8] [--standby] [--fault kill|oom|memory]

Starts a real ``chainrt-worker serve --engine vllm`` and runs ``--clients`` threads sending chat
requests back to back with the official ``openai`` client (no retries: every error counts), while
``/health/ready`` is polled every 50 ms. Each episode SIGKILLs the worker's ``VLLM::EngineCore``
child process and measures: death → first successful answer of a request sent after the death,
death → readiness back, requests failed (by HTTP status, with the ``Retry-After`` they carried)
and requests served between the death and readiness back. At the end it prints p50/max over the
episodes and, from the worker's log, where each rebuild's time went (old core shut down, new
engine core built — vLLM's own "Model loading took" and "init engine" lines split that — and the
first token). Figures are what this machine did in this run.

``--fault`` picks how each episode breaks the engine:

* ``kill`` (default): SIGKILL of the engine core process;
* ``oom``: fault injection (the worker runs with ``--enable-fault-injection``; ``POST
  /admin/faults {"oom": 1}``): the next request meets torch's ``OutOfMemoryError`` where vLLM's
  own would surface; the engine core stays alive;
* ``memory``: a real out-of-memory error inside the engine: the address space of the engine
  core's model-running process (``VLLM::Worker``, else the core itself) is capped at what it maps
  now (``prlimit`` ``RLIMIT_AS``) and a long prompt is sent, so the prefill's allocation fails
  (torch's CPU allocator: "can't allocate memory"). vLLM then ends the engine core (as in vLLM
  #52871), and recovery is the same as after a kill.

Each episode also follows the dead core's processes: how long the old core's model-running
child (``VLLM::Worker``) lives on after the death and how much CPU it burns meanwhile (the two
cores of a small machine are shared with the new core's first generations).

``--standby`` starts the worker with ``--vllm-standby``: each episode waits until the standby
engine core is ready, kills the *serving* core (its pid from ``/health/ready``) and the worker
swaps to the standby. It also prints the standby's cost: its resident memory (RSS of the standby
core process and its children) and its CPU use over 10 s while idle.
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
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import httpx  # noqa: E402
import openai  # noqa: E402
import psutil  # noqa: E402
from _workers import BenchWorker  # noqa: E402
from openai.types.chat import ChatCompletionMessageParam  # noqa: E402

_NEVER_DOWN_S = 2.0
"""Readiness still up this long after the first answer past a death: it never dropped."""


@dataclass
class Seen:
    """Successes (start, end), failures (time, status, Retry-After), readiness samples."""

    ok: list[tuple[float, float]] = field(default_factory=list)
    failed: list[tuple[float, int, str, float]] = field(default_factory=list)
    """(failed at, status, Retry-After, sent at)."""
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
                seen.failed.append((time.monotonic(), exc.status_code, wait, started))
                time.sleep(0.05)
                continue
            except openai.APIError as exc:
                seen.failed.append((time.monotonic(), 0, type(exc).__name__, started))
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


def engine_state(base: str) -> dict[str, Any]:
    """The worker's ``engine_state`` from ``/health/ready``."""
    state: dict[str, Any] = httpx.get(f"{base}/health/ready", timeout=30).json()["engine_state"]
    return state


def wait_standby(base: str, timeout_s: float = 400.0) -> dict[str, Any]:
    """Wait until the standby core is ready; the engine state then."""
    stop = time.monotonic() + timeout_s
    while time.monotonic() < stop:
        state = engine_state(base)
        if state.get("standby", {}).get("state") == "ready":
            return state
        time.sleep(0.25)
    raise RuntimeError(f"no standby core within {timeout_s}s")


def tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def standby_cost(pid: int, seconds: float = 10.0) -> str:
    """RSS and idle CPU (share of one core over ``seconds``) of the standby core's tree."""
    procs = tree(pid)
    rss = sum(p.memory_info().rss for p in procs)
    before = sum(sum(p.cpu_times()[:2]) for p in procs)
    time.sleep(seconds)
    after = sum(sum(p.cpu_times()[:2]) for p in procs)
    names = ", ".join(sorted({p.name() for p in procs}))
    return (
        f"standby core tree ({len(procs)} processes: {names}): RSS {rss / 2**20:.0f} MiB; "
        f"idle CPU {100 * (after - before) / seconds:.1f} % of one core over {seconds:.0f} s"
    )


def cpu_s(proc: psutil.Process) -> float:
    """User + system CPU seconds of ``proc`` (0 once it is gone)."""
    try:
        return float(sum(proc.cpu_times()[:2]))
    except psutil.Error:
        return 0.0


@dataclass
class Leftovers:
    """The dead core's descendants: when each disappeared, the CPU they used after the death."""

    procs: list[psutil.Process]
    cpu_at_death: dict[int, float] = field(default_factory=dict)
    cpu_last: dict[int, float] = field(default_factory=dict)
    gone_at: dict[int, float] = field(default_factory=dict)

    def start(self) -> None:
        """Read each one's CPU at the death."""
        for proc in self.procs:
            self.cpu_at_death[proc.pid] = self.cpu_last[proc.pid] = cpu_s(proc)

    def sample(self, now: float) -> None:
        """Note which are gone; keep the last CPU reading of the others."""
        for proc in self.procs:
            if proc.pid in self.gone_at:
                continue
            try:
                alive = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                alive = False
            if alive:
                self.cpu_last[proc.pid] = cpu_s(proc)
            else:
                self.gone_at[proc.pid] = now

    def summary(self, died: float) -> str:
        """``pid 123 gone after 1.20 s, 1.10 s CPU after the death`` per process."""
        parts = []
        for proc in self.procs:
            used = self.cpu_last[proc.pid] - self.cpu_at_death[proc.pid]
            gone = self.gone_at.get(proc.pid)
            when = "still running" if gone is None else f"gone after {gone - died:.2f} s"
            parts.append(f"pid {proc.pid} {when}, {used:.2f} s CPU after the death")
        return "; ".join(parts) or "none"


def cap_memory(core: psutil.Process) -> psutil.Process:
    """Cap the address space of the core's model-running process at what it maps now."""
    children = core.children(recursive=True)
    target = children[0] if children else core
    vms = target.memory_info().vms
    target.rlimit(psutil.RLIMIT_AS, (vms, vms))
    return target


def long_prompt_request(base: str, words: int) -> str:
    """One chat completion whose prefill needs memory; what came back (status or error)."""
    text = " ".join(["memory"] * words)
    ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": text}]
    with openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=120) as client:
        try:
            client.chat.completions.create(model="smol", messages=ask, max_tokens=1)
        except openai.APIStatusError as exc:
            return f"{exc.status_code} {exc.response.text[:120]}"
        except openai.APIError as exc:
            return type(exc).__name__
    return "200 (no OOM)"


def engine_core(pid: int) -> psutil.Process:
    """The worker's ``VLLM::EngineCore`` child."""
    for child in psutil.Process(pid).children(recursive=True):
        if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name():
            return child
    raise RuntimeError(f"worker {pid} has no VLLM::EngineCore child")


def episode(
    worker: BenchWorker, seen: Seen, timeout_s: float, fault: str = "kill", words: int = 1500
) -> dict[str, float | str]:
    """Break the engine once (``fault``); wait for an answer after it and for readiness."""
    assert worker.process is not None
    core_pid = engine_state(worker.base).get("core_pid") or engine_core(worker.process.pid).pid
    core = psutil.Process(core_pid)
    leftovers = Leftovers(core.children(recursive=True))
    note = ""
    if fault == "oom":
        died = time.monotonic()
        worker.faults(oom=1)
    elif fault == "memory":
        capped = cap_memory(core)
        leftovers.start()
        died = time.monotonic()
        answer = long_prompt_request(worker.base, words)
        if answer.startswith("200"):
            raise RuntimeError(f"--fault memory: the capped engine served {words} words; more?")
        note = f"capped pid {capped.pid} ({capped.name()}); the long prompt got {answer}"
    else:
        leftovers.start()
        died = time.monotonic()
        os.kill(core_pid, signal.SIGKILL)
    first = back = None
    while time.monotonic() - died < timeout_s:
        time.sleep(0.05)
        leftovers.sample(time.monotonic())
        if first is None:
            first = next((end for start, end in seen.ok if start > died), None)
        if back is None:
            down = [t for t, up in seen.ready if t > died and not up]
            if down:
                back = next((t for t, up in seen.ready if t > down[0] and up), None)
            elif first is not None and time.monotonic() - first > _NEVER_DOWN_S:
                back = died  # readiness never dropped: no request failed on the death
        if first is not None and back is not None:
            break
    if first is None or back is None:
        raise RuntimeError(f"no recovery within {timeout_s}s")
    until = max(back, first)
    fails = [f for f in seen.failed if died <= f[0] <= until]
    statuses = sorted({f"{status}(Retry-After {wait})" for _, status, wait, _ in fails})
    served = sum(1 for _, end in seen.ok if died < end < back)
    across = [end for start, end in seen.ok if start < died < end]  # in flight at the death
    late = [f for f in fails if f[3] > died]  # sent after the death: arrived during recovery
    # The first failure is when the worker noticed the death (its in-flight requests fail then).
    detected = min((f[0] for f in fails), default=float("nan"))
    return {
        "detect_s": detected - died,
        "first_answer_s": first - died,
        "ready_s": back - died,
        "failed": len(fails),
        "failed_late": len(late),
        "served": served,
        "across": len(across),
        "first_any_s": min([first, *across]) - died,
        "statuses": ", ".join(statuses) or "-",
        "old_core": "alive (injected OOM)" if fault == "oom" else leftovers.summary(died),
        "note": note,
    }


def where_it_went(result: dict[str, float | str]) -> str:
    """Death -> noticed (first failure) -> ready -> first answer; or, when no request failed
    (every one in flight replayed, readiness never dropped), the first answers alone."""
    detect, ready = float(result["detect_s"]), float(result["ready_s"])
    first = float(result["first_answer_s"])
    if result["failed"] == 0:
        return (
            f"no client request failed; death -> first answer of a request in flight (replayed) "
            f"{float(result['first_any_s']):.2f} s, of one sent after the death {first:.2f} s"
        )
    return (
        f"death -> first failure (noticed) {detect:.2f} s, -> ready {ready - detect:.2f} s "
        f"more, -> first answer {first - ready:.2f} s more"
    )


def breakdown(log: str) -> list[str]:
    """The rebuild lines of the worker's log (ours and vLLM's own timings)."""
    wanted = re.compile(
        r"vLLM rebuild:|Model loading took|init engine \(|recovered from|swapped to the standby"
        r"|standby engine core ready|can't allocate memory|OutOfMemoryError|MemoryError"
        r"|readiness generation|warmed in|replaying request|core shut down in"
    )
    return [line.strip()[-160:] for line in log.splitlines() if wanted.search(line)]


def main() -> int:
    """Run the episodes; exit 1 when an episode did not recover."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds between episodes")
    parser.add_argument("--standby", action="store_true", help="run with --vllm-standby")
    parser.add_argument("--recovery-wait", default="2", help="the worker's --recovery-wait (2)")
    parser.add_argument("--fault", choices=["kill", "oom", "memory"], default="kill")
    parser.add_argument("--words", type=int, default=1500, help="--fault memory: prompt words")
    args = parser.parse_args()
    flags: tuple[str, ...] = ("--recovery-wait", str(args.recovery_wait))
    flags += ("--vllm-standby",) if args.standby else ()
    flags += ("--enable-fault-injection",) if args.fault == "oom" else ()
    worker = BenchWorker("--engine", "vllm", "--served-model-name", "smol", *flags)
    seen = Seen()
    results: list[dict[str, float | str]] = []
    started = time.monotonic()
    threads: list[threading.Thread] = []
    try:
        worker.start(timeout_s=400)
        print(f"worker ready in {time.monotonic() - started:.1f} s", flush=True)
        if args.standby:
            state = wait_standby(worker.base)
            print(
                f"standby ready {time.monotonic() - started:.1f} s after the start "
                f"(its build: {state['standby']['build_seconds']:.1f} s)",
                flush=True,
            )
            print(standby_cost(int(state["standby"]["core_pid"])), flush=True)
        threads = [
            threading.Thread(target=client_loop, args=(worker.base, seen, args.max_tokens))
            for _ in range(args.clients)
        ]
        threads.append(threading.Thread(target=poll_ready, args=(worker.base, seen)))
        for thread in threads:
            thread.start()
        for number in range(1, args.episodes + 1):
            time.sleep(args.settle)
            if args.standby:
                wait_standby(worker.base)
            result = episode(worker, seen, 300, args.fault, args.words)
            results.append(result)
            print(
                f"episode {number}: death -> first answer {result['first_answer_s']:.2f} s, "
                f"-> ready {result['ready_s']:.2f} s; failed {result['failed']} "
                f"({result['failed_late']} sent after the death) "
                f"[{result['statuses']}]; served during recovery {result['served']}; "
                f"in flight at the death and answered {result['across']} (first answer of any "
                f"request {float(result['first_any_s']):.2f} s)",
                flush=True,
            )
            print(f"  where it went: {where_it_went(result)}", flush=True)
            print(f"  old core's processes: {result['old_core']}", flush=True)
            if result["note"]:
                print(f"  {result['note']}", flush=True)
    finally:
        seen.stop.set()
        for thread in threads:
            thread.join(120)
        log = Path(worker._log.name).read_text(errors="replace") if worker.process else ""
        worker.stop()
    firsts = [float(r["first_answer_s"]) for r in results]
    if firsts:
        print(
            f"summary [{args.fault}]: {len(results)} episodes, {args.clients} clients; "
            f"death -> first answer "
            f"p50 {statistics.median(firsts):.2f} s, max {max(firsts):.2f} s; failed "
            f"{sum(int(r['failed']) for r in results)}; answered in total {len(seen.ok)}"
        )
    print("rebuild breakdown (worker log):")
    for line in breakdown(log):
        print(f"  {line}")
    return 0 if len(results) == args.episodes else 1


if __name__ == "__main__":
    sys.exit(main())
