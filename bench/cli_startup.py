"""How long the CLI takes to start, next to a bare interpreter (issue 11: lazy imports).

    .venv/bin/python bench/cli_startup.py [--runs 15] [--json] [--modules]

Each command runs ``--runs`` times in a fresh interpreter (the same one running this script, so
the same ``PYTHONPATH``); the table shows the median and the fastest wall time and the median's
ratio to ``python -c pass``. Commands: ``chainrt --help``, ``chainrt validate chains/hello.yaml``,
``chainrt runs`` on a fresh SQLite store (created by one untimed run first), ``import chainrt``.
The CLI is started the way the console script starts it (``from chainrt.cli import main``), so
``-m`` machinery does not count. Goals (issue 11): ``--help`` within 8x, ``runs`` within 12x.
``--modules`` also lists which heavy packages each command imported.

Start times are noisy on a shared machine: the median of many runs, with the bare interpreter
measured interleaved with the commands (round-robin), keeps the ratio fair when load shifts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CLI = "import sys; from chainrt.cli import main; sys.exit(main(sys.argv[1:]))"
_HEAVY = (
    "httpx",
    "pydantic",
    "pydantic_settings",
    "redis",
    "yaml",
    "opentelemetry",
    "langchain_core",
    "tenacity",
    "anyio",
    "chainrt.dispatch",
    "chainrt.store",
    "chainrt._runner",
    "workers",
)
_REPORT = (
    "import sys; heavy = {heavy!r}; "
    "print('MODULES ' + ','.join(h for h in heavy if h in sys.modules), file=sys.stderr)"
)


def _commands(store: str) -> dict[str, list[str]]:
    py = sys.executable
    return {
        "python -c pass": [py, "-c", "pass"],
        "import chainrt": [py, "-c", "import chainrt"],
        "chainrt --help": [py, "-c", _CLI, "--help"],
        "chainrt validate chains/hello.yaml": [py, "-c", _CLI, "validate", "chains/hello.yaml"],
        "chainrt runs (SQLite)": [py, "-c", _CLI, "runs", "--store", store],
    }


def _env() -> dict[str, str]:
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(ROOT) if not path else f"{ROOT}{os.pathsep}{path}"
    for name in [k for k in env if k.startswith("OTEL_")]:  # tracing would load OpenTelemetry
        del env[name]
    env.pop("CHAINRT_TRACE", None)
    return env


def _time_once(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(
            f"cli_startup: {' '.join(argv[-3:])} exited {done.returncode}: "
            f"{done.stderr.decode(errors='replace').strip()[-300:]}"
        )
    return elapsed


def _modules(argv: list[str], env: dict[str, str]) -> str:
    """Which of the heavy packages the command imported (run once more, reporting at exit)."""
    hook = _REPORT.format(heavy=_HEAVY)
    if argv[1] == "-c":
        code = f"import atexit\natexit.register(lambda: exec({hook!r}, {{}}))\n{argv[2]}"
        argv = [argv[0], "-c", code, *argv[3:]]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    for line in done.stderr.splitlines():
        if line.startswith("MODULES "):
            return line.removeprefix("MODULES ") or "-"
    return "?"


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="runs per command (median taken)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--modules", action="store_true", help="list heavy modules imported")
    args = parser.parse_args()
    env = _env()
    with tempfile.TemporaryDirectory(prefix="chainrt-startup-") as tmp:
        store = f"sqlite:///{Path(tmp) / 'runs.db'}"
        commands = _commands(store)
        for argv in commands.values():  # warm the page cache and create the store
            _time_once(argv, env)
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(max(1, args.runs)):
            for name, argv in commands.items():
                samples[name].append(_time_once(argv, env))
        modules = (
            {name: _modules(argv, env) for name, argv in commands.items()} if args.modules else {}
        )
    bare = statistics.median(samples["python -c pass"])
    rows = {
        name: {
            "median_ms": round(statistics.median(values) * 1e3, 1),
            "min_ms": round(min(values) * 1e3, 1),
            "ratio": round(statistics.median(values) / bare, 2),
        }
        for name, values in samples.items()
    }
    if args.json:
        print(json.dumps({"runs": args.runs, "python": sys.version.split()[0], "rows": rows}))
        return
    print(f"start-up times, median of {args.runs} runs each (python {sys.version.split()[0]})")
    print(f"{'command':<38} {'median':>9} {'min':>9} {'x bare':>7}")
    for name, row in rows.items():
        print(
            f"{name:<38} {row['median_ms']:>7.1f}ms {row['min_ms']:>7.1f}ms {row['ratio']:>6.2f}x"
        )
        if name in modules:
            print(f"    imports: {modules[name]}")
    print("goals: chainrt --help <= 8x bare, chainrt runs (SQLite) <= 12x bare")


if __name__ == "__main__":
    main()
