"""Hot reload under load: latency before and after, failures, readiness; episodes and a control.

    .venv/bin/python bench/reload.py [--clients 4] [--seconds 20] [--episodes 3] [--sham]
    python bench/reload.py --engine torch --random-model     # a GPU host (or slowly, the CPU)
    python bench/reload.py --engine torch --random-model --episodes 6 --sham --prompts 4

Starts a real worker (``--served-model-name v1 --admin-token ...``), runs ``--clients`` threads
each sending chat requests back to back with the official ``openai`` client, polls
``/health/ready`` every 50 ms, and after ``--warmup`` seconds runs ``--episodes`` episodes of
``--seconds`` each with a reload in the middle: ``/admin/reload`` to a copy of the model (local
engine: a copy of the GGUF under another file name; torch engine: a copy of a random-weights
Llama's HF folder, built here as in ``bench/gpu_oom.py``), then the original again, and so on,
served as ``v2``, ``v3``, ... With ``--sham`` every reload episode is preceded by a control
episode of the same length with no reload: its "p99 change" is what two adjacent windows differ
by on this machine with nothing happening, the noise floor the reload's change is read against.

The two windows of an episode are comparable: the "before" window holds the requests that started
in the half-episode before the reload was asked for and ended before it, the "after" window those
that started after the reload answered and ended within the same length of time; then both are cut
to the same number of requests (the last ones before, the first ones after). Printed per episode:
n, p50, p99 and the p99 change; at the end the median of the episodes' p99 changes, the p99 of all
reload episodes' windows pooled, the failures, the readiness answers that were not 200, which model
answered after each swap and the reloads' own timing. Figures are what this machine did in this run.

One 10-second window's p99 is about its largest request, so one episode's change says little. With
``--sham`` the summary also pools the windows of all reload episodes and of all control episodes
(each side then holds hundreds of requests) and gives each pooled change a 95 % bootstrap interval
over episodes (``bench/_reload_stats.py``); and "around the swap" compares the requests that
ended within a fixed stretch from a reload's ask (the reloads' median time to answer plus
``--around`` seconds; those in flight across it included) with the requests that ended in as long
a stretch from a control's midpoint, pooled, with its own interval: the reload's cost read
against what the same moment costs with no reload. ``--dump FILE`` writes every request and
episode as JSON, to be read again without a GPU: ``--from-dump A.json [B.json ...]`` prints the
report again from dumps instead of running, pooling the episodes of every file given (runs of the
same code on different leases: more episodes narrow the intervals).
``--prompts N`` makes the clients cycle through N prompts of different lengths (the shapes a
reload's warm-up has to cover), client ``i`` starting at prompt ``i``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import httpx  # noqa: E402
from _reload_stats import Pair, bootstrap, change, pooled_change, quantiles, ratio  # noqa: E402
from _workers import BenchWorker  # noqa: E402
from openai import OpenAI  # noqa: E402
from openai.types.chat import ChatCompletionMessageParam  # noqa: E402

from chainrt.engines import resolve_model_path  # noqa: E402

TOKEN = "bench-reload-token-0123456789"


@dataclass
class Seen:
    """Per request: (start, end, model that answered); failures; readiness answers not 200."""

    answers: list[tuple[float, float, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    not_ready: int = 0
    ready_polls: int = 0
    stop: threading.Event = field(default_factory=threading.Event)


def prompt(number: int) -> str:
    """The ``number``-th prompt (0: "Name a color."; each next one 10 characters longer)."""
    return "Name a color." + " Be brief." * number


def client_loop(base: str, seen: Seen, max_tokens: int, prompts: int, first: int) -> None:
    """Ask back to back until told to stop, cycling through ``prompts`` prompts from ``first``."""
    asks: list[list[ChatCompletionMessageParam]] = [
        [{"role": "user", "content": prompt(n)}] for n in range(prompts)
    ]
    turn = first
    with OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        while not seen.stop.is_set():
            started = time.monotonic()
            ask, turn = asks[turn % prompts], turn + 1
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


@dataclass
class Episode:
    """One window pair: the half before the reload was asked for, the half after it answered."""

    kind: str
    """``reload`` or ``sham`` (the same timing with no reload: the control)."""
    opened: float
    asked: float
    swapped: float = 0.0
    closed: float = 0.0
    name: str = ""
    """The served name the reload asked for (empty for a sham)."""
    status: int = 0
    answer: str = ""

    def windows(self, seen: Seen) -> tuple[list[float], list[float], set[str]]:
        """Latencies before and after, cut to the same count; the models that answered the
        requests started after the swap and before the episode closed (however long they took:
        on a loaded CPU a request can outlast the after window, and the check must not go
        empty)."""
        before = sorted(
            (a for a in seen.answers if a[0] >= self.opened and a[1] < self.asked),
            key=lambda a: a[0],
        )
        after = sorted(
            (a for a in seen.answers if a[0] > self.swapped and a[1] < self.closed),
            key=lambda a: a[0],
        )
        count = min(len(before), len(after))
        kept_before = before[len(before) - count :]
        kept_after = after[:count]
        return (
            [end - start for start, end, _ in kept_before],
            [end - start for start, end, _ in kept_after],
            {model for start, _, model in seen.answers if self.swapped < start < self.closed},
        )

    def around(self, seen: Seen, reach: float) -> list[float]:
        """Latencies of the requests that ended within ``reach`` seconds of the moment the
        reload was asked for (a sham: of its midpoint): every request a reload could have
        slowed, those in flight across it included."""
        return [e - s for s, e, _ in seen.answers if self.asked <= e <= self.asked + reach]


def run_episode(base: str, kind: str, half: float, model: str, name: str) -> Episode:
    """``half`` seconds of load, a reload (``kind == "reload"``) or nothing, ``half`` more."""
    episode = Episode(kind, opened=time.monotonic(), asked=0.0, name=name)
    time.sleep(half)
    episode.asked = time.monotonic()
    if kind == "reload":
        answer = httpx.post(
            f"{base}/admin/reload",
            json={"model": model, "served_model_name": name},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=300,
        )
        episode.status, episode.answer = answer.status_code, answer.text
    episode.swapped = time.monotonic()
    time.sleep(half)
    episode.closed = time.monotonic()
    return episode


def report(episodes: list[Episode], seen: Seen, around: float) -> bool:
    """Print every episode and the summary; True when every reload answered 200 and every
    request after it was answered by the new model."""
    ok = True
    changes: dict[str, list[float]] = {"reload": [], "sham": []}
    pairs: dict[str, list[Pair]] = {"reload": [], "sham": []}
    arounds: dict[str, list[list[float]]] = {"reload": [], "sham": []}
    # Every window around a swap (or a control's midpoint) lasts as long: the reloads' median
    # time to answer, plus ``around``. (Windows of different lengths hold different counts, and
    # a p99 of more requests is higher with nothing else changed.)
    took = [e.swapped - e.asked for e in episodes if e.kind == "reload"]
    reach = (statistics.median(took) if took else 0.0) + around
    for number, episode in enumerate(episodes, 1):
        before, after, models = episode.windows(seen)
        moved = change(before, after)
        line = f"episode {number} ({episode.kind}): before {quantiles(before)}; after {quantiles(after)}"
        if moved is not None:
            changes[episode.kind].append(moved)
            line += f"; p99 {moved:+.1f} %"
        print(line)
        pairs[episode.kind].append((before, after))
        arounds[episode.kind].append(episode.around(seen, reach))
        if episode.kind == "reload":
            print(
                f"  reload to {episode.name}: HTTP {episode.status} in "
                f"{episode.swapped - episode.asked:.2f} s: {_short(episode.answer)}; "
                f"{_across(episode, seen)}; answered after by {', '.join(sorted(models))}"
            )
            print(f"  {_slowest_around(episode, seen, around)}")
            ok = ok and episode.status == 200 and models == {episode.name}
        else:
            print(f"  {_across(episode, seen)}")
    for kind, label in (("reload", "reload episodes"), ("sham", "control (no reload)")):
        if changes[kind]:
            listed = ", ".join(f"{c:+.1f}" for c in changes[kind])
            print(
                f"{label}: median p99 change {statistics.median(changes[kind]):+.1f} % "
                f"(episodes: {listed})"
            )
    for kind, label in (("reload", "reload episodes"), ("sham", "control episodes")):
        _pooled(label, pairs[kind])
    _around(arounds, reach)
    return ok


def _pooled(label: str, pairs: list[Pair]) -> None:
    """The windows of all episodes of one kind pooled, with a bootstrap interval over episodes."""
    if len(pairs) < 1 or sum(len(b) for b, _ in pairs) < 2:
        return
    before = [x for b, _ in pairs for x in b]
    after = [x for _, a in pairs for x in a]
    interval = bootstrap(lambda picks: pooled_change([pairs[i] for i in picks]), len(pairs))
    spread = f" (95 % bootstrap over episodes {interval[0]:+.1f} .. {interval[1]:+.1f} %)" \
        if interval else ""  # fmt: skip
    print(
        f"{label} pooled: before {quantiles(before)}; after {quantiles(after)}"
        f"; p99 {pooled_change(pairs) or 0.0:+.1f} %{spread}"
    )


def _around(arounds: dict[str, list[list[float]]], seconds: float) -> None:
    """Requests ending around the reload against those ending around a control's instant."""
    tested, control = arounds["reload"], arounds["sham"]
    if not tested or not control:
        return
    moved = ratio(tested, control)
    if moved is None:
        return
    count = min(len(tested), len(control))
    interval = bootstrap(
        lambda picks: ratio([tested[i] for i in picks], [control[i] for i in picks]), count
    )
    spread = f" (95 % bootstrap over episodes {interval[0]:+.1f} .. {interval[1]:+.1f} %)" \
        if interval else ""  # fmt: skip
    print(
        f"around the swap (requests ending within {seconds:.2f} s of the ask or midpoint): "
        f"reload {quantiles([x for w in tested for x in w])}; "
        f"control {quantiles([x for w in control for x in w])}; p99 {moved:+.1f} %{spread}"
    )


def _across(episode: Episode, seen: Seen) -> str:
    """The requests in neither window: those running while the reload was asked for and
    answered (a sham: at the instant it would have been), with their slowest latency."""
    during = [e - s for s, e, _ in seen.answers if e >= episode.asked and s <= episode.swapped]
    slowest = f", slowest {max(during) * 1000:.0f} ms" if during else ""
    return f"{len(during)} request(s) across it{slowest}"


def _slowest_around(episode: Episode, seen: Seen, seconds: float, count: int = 3) -> str:
    """Where the slowest requests of the window around a swap sat: their latency, start and end
    relative to the ask (the swap came ``swapped - asked`` later), and the model that answered."""
    near = [a for a in seen.answers if episode.asked <= a[1] <= episode.swapped + seconds]
    near.sort(key=lambda a: a[1] - a[0], reverse=True)
    spots = [
        f"{(e - s) * 1000:.0f} ms ({s - episode.asked:+.2f}..{e - episode.asked:+.2f} s, {m})"
        for s, e, m in near[:count]
    ]
    return (
        f"slowest around it (from the ask; swap at +{episode.swapped - episode.asked:.2f} s): "
        + ", ".join(spots)
    )


def _short(text: str) -> str:
    """The reload answer's timing fields, or the text as it came."""
    try:
        body = json.loads(text)
    except ValueError:
        return text[:200]
    keys = ("load_seconds", "seconds", "draining", "handed_over")
    return " ".join(f"{k}={body[k]}" for k in keys if k in body) or text[:200]


def from_dumps(paths: list[Path], around: float) -> bool:
    """Print the report of the episodes of every dump in ``paths`` pooled (:func:`report`).

    Each file's clock is its own machine's: its times are moved past the previous file's, so
    that an episode's windows only ever hold the requests of its own run."""
    seen = Seen()
    episodes: list[Episode] = []
    offset = 0.0
    for path in paths:
        record = json.loads(path.read_text())
        answers = [(float(s), float(e), str(m)) for s, e, m in record["answers"]]
        times = [t for s, e, _ in answers for t in (s, e)]
        shift = offset - min(times, default=0.0)
        seen.answers.extend((s + shift, e + shift, m) for s, e, m in answers)
        for raw in record["episodes"]:
            episode = Episode(**raw)
            for name in ("opened", "asked", "swapped", "closed"):
                setattr(episode, name, getattr(episode, name) + shift)
            episodes.append(episode)
        offset = max(times, default=0.0) + shift + 3600.0
        print(f"{path}: {len(answers)} requests, {len(record['episodes'])} episodes")
    return report(episodes, seen, around)


def main() -> int:
    """Run the benchmark; exit 1 when a request failed, readiness dropped or a reload failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of one episode")
    parser.add_argument("--episodes", type=int, default=3, help="episodes with a reload")
    parser.add_argument("--sham", action="store_true", help="a control episode before each")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load not counted")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument(
        "--dump", type=Path, help="write every request (start, end, model) and episode as JSON"
    )
    parser.add_argument(
        "--prompts", type=int, default=1, help="distinct prompt lengths the clients cycle through"
    )
    parser.add_argument(
        "--around", type=float, default=2.0, help="seconds after a swap its window covers"
    )
    parser.add_argument("--engine", choices=["local", "torch"], default="local")
    parser.add_argument(
        "--random-model", action="store_true", help="torch: serve a random-weights Llama built here"
    )
    parser.add_argument(
        "--from-dump",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="print the report from dumps written by --dump (episodes pooled), run nothing",
    )
    args = parser.parse_args()
    if args.from_dump:
        return 0 if from_dumps(args.from_dump, args.around) else 1
    if args.engine == "torch" and not args.random_model:
        parser.error("--engine torch needs --random-model (nothing is downloaded)")
    folder = Path(tempfile.mkdtemp(prefix="chainrt-reload-"))
    if args.engine == "local":
        engine = ["--engine", "local"]
        first = resolve_model_path()
        copy = folder / "model-v2.gguf"
        shutil.copyfile(first, copy)
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
    episodes: list[Episode] = []
    try:
        worker.start()
        threads = [
            threading.Thread(
                target=client_loop,
                args=(worker.base, seen, args.max_tokens, args.prompts, number),
            )
            for number in range(args.clients)
        ]
        threads.append(threading.Thread(target=poll_ready, args=(worker.base, seen)))
        for thread in threads:
            thread.start()
        time.sleep(args.warmup)
        half = args.seconds / 2
        for number in range(args.episodes):
            if args.sham:
                episodes.append(run_episode(worker.base, "sham", half, "", ""))
            model = str(copy if number % 2 == 0 else first)
            episodes.append(run_episode(worker.base, "reload", half, model, f"v{number + 2}"))
        seen.stop.set()
        for thread in threads:
            thread.join(300)
    finally:
        seen.stop.set()
        worker.stop()
        shutil.rmtree(folder, ignore_errors=True)
    print(
        f"engine={args.engine} clients={args.clients} seconds={args.seconds} "
        f"episodes={args.episodes} sham={args.sham} max_tokens={args.max_tokens} "
        f"prompts={args.prompts} "
        f"requests={len(seen.answers)}"
    )
    ok = report(episodes, seen, args.around)
    if args.dump is not None:
        record = {
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "answers": seen.answers,
            "episodes": [asdict(episode) for episode in episodes],
        }
        args.dump.write_text(json.dumps(record))
    print(f"failed requests: {len(seen.failures)}")
    for failure in seen.failures[:5]:
        print(f"  {failure}")
    print(f"readiness polls: {seen.ready_polls}, not ready: {seen.not_ready}")
    ok = ok and not seen.failures and seen.not_ready == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
