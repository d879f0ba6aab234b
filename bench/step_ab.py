"""The runner of two checkouts side by side: CPU per step, steps/s and memory, in paired rounds.

    .venv/bin/python bench/step_ab.py --base REF [--level 64] [--steps 100] [--rounds 24]
                                         [--store redis|sqlite|redis-cluster]

On a shared 2-CPU machine the same code's steps/s moves by a third from one minute to the next
(``docs/performance.md``, round 13), more than most changes to the step path. Here a change is
read against its base in the same minutes: the base is checked out (``git worktree``, REF: any
commit) and two long-lived runner processes, one importing each checkout, take turns on private
Redis servers (AOF, as docker-compose runs it). Each round, each of them runs ``--level`` runs at
once of a chain of ``--steps`` no-op tool steps (the order alternates from round to round); the
bench prints each side's CPU us per step and durable steps/s (medians over the rounds), and the
median and quartiles of the per-round ratios (this working tree over the base), with a 95 %
interval for the median. Last, the bytes per step one run holds in memory just before its last
step is written (its step records and results so far; tracemalloc, one run of ``--steps``).
``--store sqlite`` gives each side a SQLite file of its own (in a temporary directory) instead;
``--store redis-cluster`` a private local Redis Cluster each (3 masters, no replicas, AOF).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _median_ci import order_interval
from _redis import private_server

ROOT = Path(__file__).resolve().parent.parent
"""This working tree (the side called ``this``)."""


class _Side:
    """One runner process importing chainrt from ``tree``."""

    def __init__(self, name: str, tree: Path, url: str, level: int, steps: int) -> None:
        self.name = name
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "_ab_worker.py"), url, str(level), str(steps)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT / "bench",
        )  # fmt: skip
        ready = self._line()
        if not ready.startswith("ready "):
            raise SystemExit(f"step_ab: the {name} runner did not start: {ready!r}")
        self.imports = ready.removeprefix("ready ")
        self.cpu: list[float] = []
        self.rate: list[float] = []

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def ask(self, what: str) -> tuple[float, float, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        line = self._line()
        if not line:
            raise SystemExit(f"step_ab: the {self.name} runner stopped (exit {self.proc.wait()})")
        cpu, rate, held = (float(part) for part in line.split())
        return cpu, rate, held

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)


def _ratios(label: str, base: list[float], this: list[float]) -> str:
    ratios = sorted(b / a for a, b in zip(base, this, strict=True))
    median = statistics.median(ratios)
    low, high, _ = order_interval(ratios)
    quarter = len(ratios) // 4
    return (
        f"{label:<24} this / base per round: median {median:.3f} (95 % interval "
        f"{low:.3f}-{high:.3f}; quartiles {ratios[quarter]:.3f}-{ratios[-1 - quarter]:.3f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", required=True, help="the commit to compare with (any git ref)")
    parser.add_argument("--level", type=int, default=64, help="runs at once (default 64)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument(
        "--store",
        choices=("redis", "sqlite", "redis-cluster"),
        default="redis",
        help="the store (default redis)",
    )
    args = parser.parse_args()
    if args.level < 1 or args.steps < 2 or args.rounds < 2:
        parser.error("--level needs at least 1, --steps and --rounds at least 2")
    server_args = argparse.Namespace(no_persistence=False)
    with tempfile.TemporaryDirectory(prefix="chainrt-ab-") as tmp:
        tree = Path(tmp) / "base"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), args.base],
            check=True, capture_output=True,
        )  # fmt: skip
        sides: list[_Side] = []
        try:
            if args.store == "sqlite":
                sides = [
                    _Side(name, where, f"sqlite:///{tmp}/{name}.db", args.level, args.steps)
                    for name, where in (("base", tree), ("this", ROOT))
                ]
                _compare(sides, args)
                return
            if args.store == "redis-cluster":
                from chainrt.testing.redis_cluster import LocalCluster

                with (
                    LocalCluster(replicas=0, durable=True) as one,
                    LocalCluster(replicas=0, durable=True) as two,
                ):
                    sides = [
                        _Side("base", tree, one.url, args.level, args.steps),
                        _Side("this", ROOT, two.url, args.level, args.steps),
                    ]
                    _compare(sides, args)
                return
            with private_server(server_args) as one, private_server(server_args) as two:
                sides = [
                    _Side("base", tree, one.url, args.level, args.steps),
                    _Side("this", ROOT, two.url, args.level, args.steps),
                ]
                _compare(sides, args)
        finally:
            for side in sides:
                side.close()
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                check=False, capture_output=True,
            )  # fmt: skip


def _compare(sides: list[_Side], args: argparse.Namespace) -> None:
    base, this = sides
    for number in range(args.rounds):
        for side in sides if number % 2 == 0 else sides[::-1]:
            cpu, rate, _ = side.ask("go")
            side.cpu.append(cpu)
            side.rate.append(rate)
    held = [side.ask("memory")[2] for side in sides]
    where = {
        "sqlite": "a SQLite file per side",
        "redis": "private Redis (AOF everysec) per side, loopback",
        "redis-cluster": "private Redis Cluster (3 masters, AOF everysec) per side, loopback",
    }[args.store]
    print(
        f"{args.level} runs at once x {args.steps} no-op tool steps, {args.rounds} paired rounds, "
        f"{where}"
    )
    for side, mem in zip(sides, held, strict=True):
        print(
            f"{side.name:<5} {side.imports}: CPU {statistics.median(side.cpu):.1f} us/step, "
            f"{statistics.median(side.rate):,.0f} steps/s (medians); one run holds "
            f"{mem:,.0f} B/step before its end"
        )
    print(_ratios("CPU per step", base.cpu, this.cpu))
    print(_ratios("steps/s", base.rate, this.rate))


if __name__ == "__main__":
    main()
