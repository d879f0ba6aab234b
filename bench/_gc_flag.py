"""The runner's garbage-collector tuning in a bench that stands in for a runner process.

``chainrt run``/``resume``/``serve`` tune their collector (``chainrt/_gc.py``); a bench that
measures the runner in its own process does the same, after its warm-up, unless it is given
``--no-gc-tuning`` (or ``CHAINRT_GC_TUNING=0``), and prints which one it measured and the
process's memory (RSS) at the end.
"""

from __future__ import annotations

import argparse
import resource

from chainrt._gc import GC_THRESHOLDS, tune_gc_for_runner

__all__ = ["add_gc_flag", "apply_gc", "memory_label"]


def add_gc_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--no-gc-tuning`` to a bench's arguments."""
    parser.add_argument(
        "--no-gc-tuning",
        action="store_true",
        help="leave Python's garbage collector as it is (default: tune it as chainrt run/serve "
        "do, chainrt/_gc.py)",
    )


def apply_gc(args: argparse.Namespace) -> str:
    """Tune the collector unless told not to; the line that says which, for the output."""
    if args.no_gc_tuning:
        return "gc: Python's defaults (--no-gc-tuning)"
    if tune_gc_for_runner():
        return f"gc: tuned as chainrt's own processes (freeze, thresholds {GC_THRESHOLDS})"
    return "gc: Python's defaults (CHAINRT_GC_TUNING is off)"


def memory_label() -> str:
    """This process's resident memory now and at its peak, in MiB."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    now = pages * resource.getpagesize() / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return f"RSS {now:.1f} MiB now, {peak:.1f} MiB peak"
