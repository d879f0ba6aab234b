"""Does a step cost more in a longer chain? Per-step cost and validation time against chain length.

    .venv/bin/python bench/scaling.py [--steps 10,100,1000,2000] [--validate 1000,2000,5000,10000]
        [--store sqlite:///tmp/x.db | redis]

Issue 12, finding 15: the cost of a durable step must not grow with the number of steps in the
chain, and validating a chain must take time linear in its length. For each length the bench
runs chains of no-op async tools, each step reading the previous step's output through a
template, every step checkpointed, and prints the step-to-step p50, the whole run divided by its
steps (run creation, the final commit and every outlier included), and both as a ratio to the
shortest chain. Then it writes chain files of each ``--validate`` length and prints the time
``load_spec`` takes (YAML, models, template and tool checks; best of 3) per step. Without
--store it uses a fresh SQLite file; `--store redis` starts a private redis-server (AOF, fsync
every second).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _redis import add_persistence_flag

from chainrt._runtime import open_runtime
from chainrt.spec import load_spec, spec_from_dict

HERE = Path(__file__).resolve().parent


def _chain(steps: int) -> dict[str, Any]:
    listed: list[dict[str, Any]] = [{"id": "s0", "tool": "_noop_tools.py:take"}]
    for i in range(1, steps):
        args = {"value": f"{{{{ steps.s{i - 1}.output }}}}"}
        listed.append({"id": f"s{i}", "tool": "_noop_tools.py:take", "args": args})
    return {"name": "scaling", "budget": "1h", "steps": listed}


def _yaml(steps: int) -> str:
    lines = ["name: scaling", "budget: 1h", "steps:", "  - id: s0", "    tool: tools.py:take"]
    for i in range(1, steps):
        lines += [
            f"  - id: s{i}",
            "    tool: tools.py:take",
            f'    args: {{value: "{{{{ steps.s{i - 1}.output }}}}"}}',
        ]
    return "\n".join(lines) + "\n"


async def _steps(store_url: str, lengths: list[int], total_steps: int) -> None:
    print(f"{'steps':>6} {'runs':>5} {'step p50 ms':>12} {'run/steps ms':>13} {'ratios':>14}")
    first: tuple[float, float] | None = None
    async with open_runtime(store=store_url) as runtime:
        for length in lengths:
            spec = spec_from_dict(_chain(length))
            runs = max(2, total_steps // length)
            await runtime.runner.run(spec, {}, source_dir=HERE)  # warm-up
            gaps: list[float] = []
            per_step: list[float] = []
            for _ in range(runs):
                t = time.perf_counter()
                result = await runtime.runner.run(spec, {}, source_dir=HERE)
                took = time.perf_counter() - t
                assert result.status == "completed", result.error
                records = await runtime.store.get_steps(result.run_id)
                starts = sorted(r.started_at for r in records.values())
                gaps += [(b - a) * 1e3 for a, b in itertools.pairwise(starts)]
                per_step.append(took * 1e3 / length)
            p50, whole = statistics.median(gaps), statistics.median(per_step)
            first = first or (p50, whole)
            ratios = f"{p50 / first[0]:.2f}x {whole / first[1]:.2f}x"
            print(f"{length:>6} {runs:>5} {p50:>12.3f} {whole:>13.3f} {ratios:>14}")


def _validate(lengths: list[int]) -> None:
    print("\nload_spec: best of 3 loads per length (what the code can do, not a busy machine)")
    print(f"{'steps':>6} {'load_spec ms':>13} {'ms/step':>8} {'ratio per step':>15}")
    first: float | None = None
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "tools.py").write_text("async def take(value=None):\n    return 1\n")
        for length in lengths:
            path = Path(tmp) / f"chain{length}.yaml"
            path.write_text(_yaml(length))
            times = []
            for _ in range(3):
                t = time.perf_counter()
                load_spec(path)
                times.append(time.perf_counter() - t)
            best = min(times) * 1e3
            first = first or best / length
            print(
                f"{length:>6} {best:>13.1f} {best / length:>8.3f} {best / length / first:>14.2f}x"
            )


def _lengths(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", help="store URL; 'redis' starts a private redis-server")
    parser.add_argument("--steps", type=_lengths, default=[10, 100, 1000, 2000])
    parser.add_argument(
        "--total", type=int, default=4000, help="steps run per length (at least 2 runs)"
    )
    parser.add_argument("--validate", type=_lengths, default=[1000, 2000, 5000, 10000])
    add_persistence_flag(parser)
    args = parser.parse_args()
    if args.store == "redis":
        from _redis import persistence_label, private_server

        print(f"private redis-server, {persistence_label(args)}")
        with private_server(args) as server:
            print(f"store {server.url}")
            asyncio.run(_steps(server.url, args.steps, args.total))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            url = args.store or f"sqlite:///{tmp}/scaling.db"
            print(f"store {url}")
            asyncio.run(_steps(url, args.steps, args.total))
    if args.validate:
        _validate(args.validate)


if __name__ == "__main__":
    main()
